/* Exact resumption of a training run (see trainer_resume.h). */
#include "trainer_resume.h"

#include "kb_cluster.h"

#include "bytes.h"
#include "files.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int trainer_mlp_save_opt(const nn_mlp_t *m, carls_ckpt_t *c, char *err, size_t errlen)
{
    const int64_t dims[1] = {(int64_t)m->num_params};
    float *host = NULL;
    const float *state[2] = {m->opt_m, m->opt_v};
    const char *names[2] = {"opt.m", "opt.v"};
    int rc = carls_ckpt_add_u64(c, "opt.t", (uint64_t)m->opt_t);
    for (int k = 0; k < 2 && rc == 0; k++) {
        if (!state[k]) {
            continue;
        }
        host = host ? host : carls_xmalloc(sizeof(float) * m->num_params);
        m->ops->to_host(host, state[k], sizeof(float) * m->num_params);
        rc = carls_ckpt_add(c, names[k], 1, dims, host);
    }
    free(host);
    if (rc != 0) {
        return carls_errorf(err, errlen, -1, "cannot add the optimiser state to the checkpoint: %s",
                            carls_ckpt_strerror(rc));
    }
    return 0;
}

/* Copies tensor `name` of c (num_params floats) into the device buffer *dst of m, allocating it first. */
static int s_load_opt_tensor(nn_mlp_t *m, const carls_ckpt_t *c, const char *name, float **dst, char *err,
                             size_t errlen)
{
    const carls_ckpt_tensor_t *t = carls_ckpt_find(c, name);
    if (!t) {
        return 0;
    }
    if (t->ndim != 1 || t->numel != (int64_t)m->num_params) {
        return carls_errorf(err, errlen, -1, "tensor %s has %lld values, the model has %zu parameters", name,
                            (long long)t->numel, m->num_params);
    }
    if (!*dst) {
        *dst = m->ops->alloc(sizeof(float) * m->num_params);
    }
    m->ops->to_device(*dst, t->data, sizeof(float) * m->num_params);
    return 0;
}

int trainer_mlp_load_state(nn_mlp_t *m, const carls_ckpt_t *c, char *err, size_t errlen)
{
    nn_mlp_t *saved = NULL;
    if (nn_mlp_from_ckpt(c, NN_DEVICE_CPU, 1, &saved, err, errlen) != 0) {
        return -1;
    }
    const nn_mlp_config_t *a = &saved->cfg, *b = &m->cfg;
    bool same = a->in_dim == b->in_dim && a->n_hidden == b->n_hidden && a->num_classes == b->num_classes &&
                saved->num_params == m->num_params;
    for (int l = 0; same && l < a->n_hidden; l++) {
        same = a->hidden[l] == b->hidden[l];
    }
    if (!same) {
        nn_mlp_destroy(&saved);
        return carls_errorf(err, errlen, -1, "the checkpoint's model (%d inputs, %d hidden layers, %d classes, %zu "
                            "parameters) is not this run's (%d, %d, %d, %zu)", a->in_dim, a->n_hidden,
                            a->num_classes, saved->num_params, b->in_dim, b->n_hidden, b->num_classes,
                            m->num_params);
    }
    float *host = carls_xmalloc(sizeof(float) * m->num_params);
    nn_mlp_get_params(saved, host);
    nn_mlp_set_params(m, host);
    free(host);
    nn_mlp_destroy(&saved);
    uint64_t t = 0;
    if (carls_ckpt_get_u64(c, "opt.t", &t, err, errlen) != 0 || t > (uint64_t)INT32_MAX) {
        return carls_errorf(err, errlen, -1, "no usable optimiser step count (blob opt.t): not a resumable checkpoint");
    }
    if ((t > 0 && !carls_ckpt_find(c, "opt.m")) || s_load_opt_tensor(m, c, "opt.m", &m->opt_m, err, errlen) != 0 ||
        s_load_opt_tensor(m, c, "opt.v", &m->opt_v, err, errlen) != 0) {
        return *err ? -1 : carls_errorf(err, errlen, -1, "opt.t is %llu but the optimiser moments are missing",
                                        (unsigned long long)t);
    }
    m->opt_t = (int)t;
    return 0;
}

int trainer_ckpt_add_u32s(carls_ckpt_t *c, const char *name, const uint32_t *v, size_t n, char *err, size_t errlen)
{
    if (n == 0) {
        return 0;
    }
    unsigned char *b = carls_xmalloc(4 * n);
    for (size_t i = 0; i < n; i++) {
        carls_put_le32(b + 4 * i, v[i]);
    }
    int rc = carls_ckpt_add_blob(c, name, b, 4 * n);
    free(b);
    if (rc != 0) {
        return carls_errorf(err, errlen, -1, "cannot add %s (%zu values) to the checkpoint: %s", name, n,
                            carls_ckpt_strerror(rc));
    }
    return 0;
}

int trainer_ckpt_get_u32s(const carls_ckpt_t *c, const char *name, uint32_t *v, size_t n, char *err, size_t errlen)
{
    size_t len = 0;
    const unsigned char *b = carls_ckpt_blob(c, name, &len);
    if (len != 4 * n) {
        return carls_errorf(err, errlen, -1, "blob %s holds %zu bytes, this run needs %zu values (%zu bytes)", name,
                            len, n, 4 * n);
    }
    for (size_t i = 0; i < n; i++) {
        v[i] = carls_get_le32(b + 4 * i);
    }
    return 0;
}

int trainer_ckpt_add_floats(carls_ckpt_t *c, const char *name, const float *v, size_t n, char *err, size_t errlen)
{
    const int64_t dims[1] = {(int64_t)n};
    const int rc = n == 0 ? 0 : carls_ckpt_add(c, name, 1, dims, v);
    if (rc != 0) {
        return carls_errorf(err, errlen, -1, "cannot add %s (%zu values) to the checkpoint: %s", name, n,
                            carls_ckpt_strerror(rc));
    }
    return 0;
}

int trainer_ckpt_get_floats(const carls_ckpt_t *c, const char *name, float *v, size_t n, char *err, size_t errlen)
{
    const carls_ckpt_tensor_t *t = carls_ckpt_find(c, name);
    const size_t have = t ? (size_t)t->numel : 0;
    if (have != n || (t && t->ndim != 1)) {
        return carls_errorf(err, errlen, -1, "tensor %s holds %zu values, this run needs %zu", name, have, n);
    }
    if (n > 0) {
        memcpy(v, t->data, sizeof(float) * n);
    }
    return 0;
}

int trainer_ckpt_save(const carls_ckpt_t *c, const char *dir, int keep)
{
    char err[1024], path[4096];
    const unsigned long long step = (unsigned long long)carls_ckpt_step(c);
    if (carls_ckpt_save_to_dir(c, dir, path, sizeof path, err, sizeof err) != 0) {
        LOG_ERROR("checkpoint at step %llu failed: %s", step, err);
        return -1;
    }
    LOG_DEBUG("checkpoint %s", path);
    if (carls_ckpt_prune(dir, keep, err, sizeof err) < 0) {
        LOG_WARN("pruning %s: %s", dir, err);
    }
    return 0;
}

int trainer_resume_open(const char *dir, const char *kind, const char *config, carls_ckpt_t **out, char *path,
                        size_t pathlen)
{
    char err[2048];
    *out = NULL;
    if (carls_ckpt_latest_path(dir, path, pathlen, err, sizeof err) != 0) {
        fprintf(stderr, "trainer: --resume: no checkpoint to resume from in %s: %s\n", dir, err);
        return -1;
    }
    carls_ckpt_t *c = NULL;
    if (carls_ckpt_read(path, &c, err, sizeof err) != 0) {
        fprintf(stderr, "trainer: --resume: %s\n", err);
        return -1;
    }
    const char *saved = carls_ckpt_text(c, TRAINER_CKPT_CONFIG);
    if (strcmp(carls_ckpt_kind(c), kind) != 0 || !saved) {
        fprintf(stderr, "trainer: --resume: %s is a %s checkpoint without a trainer state (%s): it cannot be resumed "
                        "from (written by an older build, or by another trainer)\n",
                path, carls_ckpt_kind(c), saved ? "another kind" : "no train.config");
        carls_ckpt_destroy(&c);
        return -1;
    }
    if (strcmp(saved, config) != 0) {
        fprintf(stderr, "trainer: --resume: %s was written by a run with other settings; resume with the same "
                        "ones.\n  checkpoint: %s\n  this run:   %s\n",
                path, saved, config);
        carls_ckpt_destroy(&c);
        return -1;
    }
    *out = c;
    return 0;
}

int trainer_metrics_trim(const char *path, uint64_t step)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        return errno == ENOENT ? 0 : (LOG_ERROR("cannot read %s: %s", path, strerror(errno)), -1);
    }
    char *kept = NULL, line[8192];
    size_t len = 0, cap = 0;
    bool header = true;
    while (fgets(line, sizeof line, f)) {
        char *end = NULL;
        const double s = strtod(line, &end);
        if (header || (end != line && s <= (double)step)) {
            const size_t n = strlen(line);
            kept = carls_grow(kept, &cap, len + n + 1, 1);
            memcpy(kept + len, line, n + 1);
            len += n;
        }
        header = false;
    }
    fclose(f);
    char err[512];
    int rc = carls_write_file_atomic(path, kept ? kept : "", len, 0644, 0, err, sizeof err);
    free(kept);
    if (rc != 0) {
        LOG_ERROR("cannot rewrite %s: %s", path, err);
        return -1;
    }
    return 0;
}

struct trainer_snapshots {
    kb_cluster_t *bank;
    char prefix[200];
    int keep;
};

trainer_snapshots_t *trainer_snapshots_new(const char *endpoints, const kb_client_curve_t *curve, const char *prefix,
                                           int keep)
{
    /* Snapshot names are 1..64 characters of [A-Za-z0-9_.-], not beginning with '.' (kb_cluster.h); the
     * suffix "-step<N>" takes up to 25. */
    const size_t len = prefix ? strlen(prefix) : 0;
    bool ok = len > 0 && len <= 39 && prefix[0] != '.';
    for (size_t i = 0; ok && i < len; i++) {
        ok = (prefix[i] >= 'a' && prefix[i] <= 'z') || (prefix[i] >= 'A' && prefix[i] <= 'Z') ||
             (prefix[i] >= '0' && prefix[i] <= '9') || strchr("_.-", prefix[i]) != NULL;
    }
    if (!ok) {
        LOG_ERROR("--bank-snapshot '%s': 1..39 characters of [A-Za-z0-9_.-], not beginning with '.'",
                  prefix ? prefix : "");
        return NULL;
    }
    /* A snapshot copies every table of a shard, which can take longer than one attempt's 5 s: a resent create
     * waits for the one in progress and answers as it did (kb_cluster.h), so resending is safe, and a bank that
     * is restarting (the launcher restarts a dead shard) is waited for, at most 5 minutes in all. */
    kb_client_options_t opts = {.timeout_ms = 5000, .retries = 59, .curve = curve};
    trainer_snapshots_t *self = carls_xcalloc(1, sizeof *self);
    self->bank = kb_cluster_new(endpoints, &opts);
    if (!self->bank) {
        free(self);
        return NULL;
    }
    snprintf(self->prefix, sizeof self->prefix, "%s", prefix);
    self->keep = keep > 0 ? keep : 1;
    return self;
}

void trainer_snapshots_destroy(trainer_snapshots_t **self_p)
{
    if (!self_p || !*self_p) {
        return;
    }
    kb_cluster_destroy(&(*self_p)->bank);
    free(*self_p);
    *self_p = NULL;
}

static void s_name(const trainer_snapshots_t *self, uint64_t step, char *name, size_t len)
{
    snprintf(name, len, "%s-step%llu", self->prefix, (unsigned long long)step);
}

int trainer_snapshot_take(trainer_snapshots_t *self, uint64_t step, char *name, size_t len)
{
    char err[1024] = "";
    s_name(self, step, name, len);
    kb_cluster_snapshot_delete(self->bank, name, NULL, 0); /* a leftover of a killed run: not ours */
    const int64_t t0 = carls_monotonic_ms();
    if (kb_cluster_snapshot(self->bank, name, err, sizeof err) != 0) {
        LOG_WARN("bank snapshot %s failed: %s; the checkpoint of step %llu is written without one (a run cannot "
                 "resume from it)", name, err, (unsigned long long)step);
        *name = '\0';
        return -1;
    }
    LOG_INFO("bank snapshot %s (%.1f s)", name, (double)(carls_monotonic_ms() - t0) / 1000.0);
    return 0;
}

uint64_t trainer_ckpt_prev(uint64_t s, void *every)
{
    const uint64_t n = (uint64_t)*(const int *)every;
    if (s == 0) {
        return UINT64_MAX;
    }
    return s % n ? s / n * n : s - n;
}

void trainer_snapshot_prune(trainer_snapshots_t *self, uint64_t step, uint64_t (*prev)(uint64_t s, void *ctx),
                            void *ctx)
{
    uint64_t s = step;
    for (int k = 0; k < self->keep && s != UINT64_MAX; k++) {
        s = prev(s, ctx);
    }
    if (s == UINT64_MAX) {
        return;
    }
    char name[256], err[1024] = "";
    s_name(self, s, name, sizeof name);
    if (kb_cluster_snapshot_delete(self->bank, name, err, sizeof err) != 0) {
        LOG_DEBUG("deleting bank snapshot %s: %s", name, err);
    }
}
