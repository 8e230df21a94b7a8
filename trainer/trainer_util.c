/* Shared helpers of the trainer's subcommands (see trainer_util.h). */
#include "trainer_util.h"
#include "trainer_resume.h"

#include "carls_args.h"
#include "checkpoint.h"
#include "files.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int trainer_parse_widths(const char *text, int *widths, int max)
{
    int n = 0;
    const char *p = text;
    while (*p) {
        char *end = NULL;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 1 || v > 65536 || n == max) {
            return -1;
        }
        widths[n++] = (int)v;
        if (*end == ',') {
            end++;
            if (!*end) {
                return -1;
            }
        } else if (*end) {
            return -1;
        }
        p = end;
    }
    return n > 0 ? n : -1;
}

void trainer_mlp_args(trainer_mlp_args_t *g, nn_mlp_config_t *model, nn_optim_config_t *opt, bool *cosine,
                      int *seed)
{
    static const char *const schedules[] = {"cosine", "constant", NULL}; /* outlives this call, as the rows do */
    *opt = (nn_optim_config_t){.kind = NN_OPT_ADAM, .lr = -1.0f, .momentum = 0.9f, .beta1 = 0.9f, .beta2 = 0.999f,
                               .eps = 1e-8f}; /* lr < 0: not given */
    *cosine = true;
    *seed = 1;
    const carls_arg_t rows[] = {
        carls_arg_custom("hidden", model, trainer_arg_hidden),
        carls_arg_custom("conv", model, trainer_arg_conv),
        carls_arg_float("dropout", &model->dropout, 0.0, 0.95),
        carls_arg_custom("optimizer", &opt->kind, trainer_arg_optimizer),
        carls_arg_float("lr", &opt->lr, 1e-9, 100.0),
        carls_arg_float("weight-decay", &opt->weight_decay, 0.0, 10.0),
        carls_arg_either("schedule", cosine, schedules),
        carls_arg_int("seed", seed, 0, 2147483647),
        {0},
    };
    _Static_assert(sizeof rows == sizeof g->rows, "trainer_mlp_args_t holds the rows");
    memcpy(g->rows, rows, sizeof rows);
}

void trainer_mlp_default_lr(nn_optim_config_t *opt)
{
    if (opt->lr < 0.0f) {
        opt->lr = opt->kind == NN_OPT_ADAM ? 1e-3f : 0.05f;
    }
}

int trainer_arg_hidden(const char *prog, const char *name, const char *text, void *out)
{
    nn_mlp_config_t *cfg = out;
    int widths[NN_MLP_MAX_HIDDEN];
    const int n = trainer_parse_widths(text, widths, NN_MLP_MAX_HIDDEN);
    if (n < 1) {
        fprintf(stderr, "%s: --%s: '%s' is not a list of 1..%d widths like 512,256\n", prog, name, text,
                NN_MLP_MAX_HIDDEN);
        return -1;
    }
    cfg->n_hidden = n;
    memcpy(cfg->hidden, widths, sizeof widths[0] * (size_t)n);
    return 0;
}

int trainer_arg_conv(const char *prog, const char *name, const char *text, void *out)
{
    nn_mlp_config_t *cfg = out;
    if (strcmp(text, "none") == 0 || !*text) {
        cfg->n_conv = 0;
        return 0;
    }
    nn_conv_block_t blocks[NN_MLP_MAX_CONV];
    int n = 0;
    const char *p = text;
    while (*p) {
        char *end = NULL;
        long v[3];
        for (int j = 0; j < 3; j++) {
            v[j] = strtol(p, &end, 10);
            if (end == p || v[j] < 1 || v[j] > NN_MLP_MAX_CONV_CHANNELS || (j < 2 && *end != ':')) {
                goto bad;
            }
            p = j < 2 ? end + 1 : end;
        }
        if (n == NN_MLP_MAX_CONV || (*p && *p != ',') || (*p == ',' && !p[1])) {
            goto bad;
        }
        blocks[n++] = (nn_conv_block_t){.channels = (int)v[0], .k = (int)v[1], .pool = (int)v[2]};
        p += *p == ',';
    }
    cfg->n_conv = n;
    memcpy(cfg->conv, blocks, sizeof blocks[0] * (size_t)n);
    return 0;
bad:
    fprintf(stderr, "%s: --%s: '%s' is not none or a list of 1..%d convolution blocks CHANNELS:KERNEL:POOL like "
                    "16:5:2\n", prog, name, text, NN_MLP_MAX_CONV);
    return -1;
}

void trainer_conv_text(const nn_mlp_config_t *cfg, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%s", cfg->n_conv ? "" : "none");
    for (int i = 0; i < cfg->n_conv && n >= 0 && (size_t)n < len; i++) {
        n += snprintf(buf + n, len - (size_t)n, "%s%d:%d:%d", i ? "," : "", cfg->conv[i].channels, cfg->conv[i].k,
                      cfg->conv[i].pool);
    }
}

int trainer_arg_optimizer(const char *prog, const char *name, const char *text, void *out)
{
    int which = 0;
    if (carls_args_choice_value(prog, name, text, (const char *const[]){"adam", "sgd", NULL}, &which) != 0) {
        return -1;
    }
    *(nn_opt_kind_t *)out = which == 0 ? NN_OPT_ADAM : NN_OPT_SGD;
    return 0;
}

int trainer_setup_threads(int requested)
{
    int n = requested > 0 ? requested : TRAINER_DEFAULT_THREADS;
    int got = nn_cpu_set_threads(n);
    LOG_INFO("OpenBLAS threads: %d", got);
    return got;
}

carls_prom_progress_t *trainer_prom;

int trainer_setup_device(const char *text, nn_device_t *out)
{
    nn_device_t requested;
    if (nn_device_parse(text, &requested) != 0) {
        fprintf(stderr, "trainer: --device: '%s' is not auto, cpu or cuda\n", text);
        return -1;
    }
    char err[512];
    if (nn_device_resolve(requested, out, err, sizeof err) != 0) {
        fprintf(stderr, "trainer: %s\n", err);
        return -1;
    }
    LOG_INFO("device: %s", nn_device_name(*out));
    return 0;
}

int trainer_fmnist_mlp_new(const nn_mlp_config_t *model, const carls_image_set_t *train, int classes,
                           nn_device_t device, int max_batch, int seed, nn_mlp_t **out)
{
    nn_mlp_config_t cfg = *model;
    cfg.in_dim = train->dim;
    cfg.num_classes = classes;
    if (cfg.n_conv > 0) {
        if (train->rows < 1 || train->cols < 1 || (int64_t)train->rows * train->cols != train->dim) {
            fprintf(stderr, "trainer: model: --conv needs images; these examples are %d features, not rows x cols "
                            "pixels\n", train->dim);
            return -1;
        }
        cfg.image_h = train->rows;
        cfg.image_w = train->cols;
        cfg.image_c = 1;
    }
    char err[2048];
    if (nn_mlp_new(&cfg, device, max_batch, (uint64_t)seed, out, err, sizeof err) != 0) {
        fprintf(stderr, "trainer: model: %s\n", err);
        return -1;
    }
    return 0;
}

void trainer_mlp_evaluate(nn_mlp_t *m, const carls_image_set_t *set, const uint32_t *which, int n, float *xbuf,
                          int32_t *ybuf, double *loss, double *acc)
{
    double loss_sum = 0.0;
    int64_t correct = 0;
    for (int off = 0; off < n; off += m->max_batch) {
        int b = n - off < m->max_batch ? n - off : m->max_batch;
        carls_image_set_batch(set, which + off, b, xbuf, ybuf);
        nn_mlp_set_batch(m, xbuf, ybuf, b);
        loss_sum += (double)nn_mlp_forward(m, b, false, 0) * b;
        correct += nn_mlp_correct(m, b, NULL);
    }
    *loss = loss_sum / n;
    *acc = (double)correct / n;
}

int trainer_open_outputs(const char *ckpt_dir, const char *metrics, const char *header, char *path, size_t pathlen,
                         int64_t resume_step, trainer_metrics_t *out)
{
    if (metrics) {
        snprintf(path, pathlen, "%s", metrics);
    } else {
        snprintf(path, pathlen, "%s/metrics.csv", ckpt_dir);
    }
    if (carls_mkdir_p(ckpt_dir, 0755, NULL, 0) != 0) {
        fprintf(stderr, "trainer: cannot create %s: %s\n", ckpt_dir, strerror(errno));
        return -1;
    }
    if (resume_step >= 0 && trainer_metrics_trim(path, (uint64_t)resume_step) != 0) {
        return -1;
    }
    if ((resume_step >= 0 ? trainer_metrics_append : trainer_metrics_open)(out, path, header) != 0) {
        fprintf(stderr, "trainer: cannot write metrics to %s\n", path);
        return -1;
    }
    return 0;
}
