/* kb-maker's options and tasks (see km_maker.h). */
#include "km_maker.h"
#include "km_words.h"

#include "km_bank.h"
#include "km_hog.h"
#include "km_spread.h"
#include "km_watch.h"

#include "data_fmnist.h"
#include "data_pairs.h"
#include "data_user.h"
#include "data_sample.h"
#include "nn_device.h"
#include "nn_mlp.h"
#include "nn_mlp_encode_u8.h"

#include "carls_args.h"
#include "checkpoint.h"
#include "log.h"
#include "protocol.h"
#include "util.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Everything a running maker holds. */
typedef struct {
    const km_opts_t *o;
    carls_fmnist_t ds;      /* the data set */
    int n_items;            /* the item pool: training images 0..n_items-1 */
    uint32_t *share;        /* (n_share) the items this worker owns, increasing */
    size_t n_share;
    uint8_t *share_px;      /* (n_share, dim) their pixels, contiguous (embed) */
    uint32_t *also_nbr;     /* (n_share, k) graph --source emb+pixels: the pixels' lists, searched once (pixels */
    float *also_score;      /* do not change during a run) and reused by every refresh */
    km_bank_t *bank;
    km_tables_t tables;
    km_watch_t *watch;      /* checkpoint tasks only */
    nn_device_t device;     /* resolved */
    uint64_t bank_retries;  /* units of work retried because the bank was unreachable */
    double pass_wait_s;     /* the latest pass's time writing to the bank, where measured (embed steps) */
} s_maker_t;

carls_prom_progress_t *km_prom;

/* A task's result when the bank was unreachable: the work is retried (s_do). */
#define S_RETRY 1

/* --pixel-features, in the order of km_pixel_features_t. */
static const char *const s_pixel_feature_names[] = {"raw", "sqrt", "centered", "sqrt-centered", "root4-centered",
                                                    "hog", NULL};

static void s_usage(FILE *out)
{
    fprintf(out,
            "usage: kb-maker --kb ENDPOINTS --task embed|graph|label|words [options]\n"
            "  --kb ENDPOINTS           knowledge bank (kb-server) endpoint, e.g. tcp://127.0.0.1:7070, or the\n"
            "                           comma-separated endpoints of a sharded bank in shard order\n"
            KB_CURVE_ARGS_HELP
            "  --ckpt-dir DIR           the trainer's checkpoint directory (watched; embed/label, graph --source emb)\n"
            "  --task embed|graph|label|words  what to make (see below)\n"
            "  --worker I/N             this maker's share: items with index %% N == I (default 0/1)\n"
            "  --device auto|cpu|cuda   where the forward pass runs (default auto)\n"
            "  --data NAME              the items' data set: fashion-mnist (default), or your own\n"
            "                           npy:FEATURES.npy,LABELS.npy | csv:FEATURES.csv,LABELS.csv (data_user.h);\n"
            "                           --task words: GCIDE (default), or pairs:PAIRS.tsv[,CANDIDATES.txt]\n"
            "                           as trainer twotower --data (data_pairs.h)\n"
            "  --data-dir DIR           its IDX files (default %s)\n"
            "  --items N                use the first N training images as items (default 0: all)\n"
            "  --tables PREFIX          table-name prefix (default fmnist): PREFIX.pixels .emb .graph .labels\n"
            "  --once                   do the task once and exit (default: loop on new checkpoints)\n"
            "  --poll-ms MS             checkpoint polling period when inotify is missing (default 500)\n"
            "  --threads N              OpenBLAS threads (default 1)\n"
            "  --bank-timeout-ms MS     wait per request attempt, 3 attempts (default: embed 10000, graph/label\n"
            "                           60000: knn requests can take long)\n"
            "  --bank-wait-s S          while the bank is unreachable, retry the work for up to S s (default 600)\n"
            "  --metrics-port P         serve progress (carls_maker_*: passes, items/s, bank wait share) for\n"
            "                           Prometheus on http://ADDRESS:P/metrics (0: a free port, logged)\n"
            "  --metrics-address A      IPv4 address for --metrics-port (default 127.0.0.1; no authentication)\n"
            "embed:\n"
            "  --encoder model|pixels   model: the checkpoint's encoder -> PREFIX.emb (default);\n"
            "                           pixels: the images themselves -> PREFIX.pixels (once)\n"
            "  --pixel-features F       --encoder pixels: raw (intensities in [0, 1], default), sqrt (their square\n"
            "                           roots), centered / sqrt-centered / root4-centered (raw, square or fourth\n"
            "                           roots minus their mean image over all items), hog (histograms of\n"
            "                           oriented gradients of the images, 6x6 cells every 3 pixels, 12 signed\n"
            "                           orientations, square roots, minus their mean; images of 6x6 or more)\n"
            "  --batch B                rows per forward chunk (default 4096)\n"
            "graph:\n"
            "  --source pixels|emb|emb+pixels  the embedding table searched (default pixels; emb: on every\n"
            "                           checkpoint; emb+pixels: on every checkpoint, each item's k nearest by\n"
            "                           the learned embeddings followed by its k nearest by pixels, 2k in all)\n"
            "  --k K                    neighbours per item (default 10)\n"
            "  --wait-embed-ms MS       emb: wait this long for the embed fleet's step (default 60000)\n"
            "                           (label --wait-graph: for the graph fleet's step)\n"
            "words (trainer twotower's word tower; items are GCIDE headwords, tables PREFIX.word .gram -> .vec):\n"
            "  --gcide-index FILE --gcide-dict FILE   GCIDE files (default Debian's dict-gcide)\n"
            "label:\n"
            "  --labels-per-class N --label-seed S   the labelled subset (as the trainer's)\n"
            "  --k K                    neighbour slots read from PREFIX.graph (default 10)\n"
            "  --spread-alpha A         label spreading alpha (default 0.99)\n"
            "  --spread-iters T         iterations (default 30)\n"
            "  --model-weight G         weight of the checkpoint's predictions in the prior (default 0)\n"
            "  --balance 0|1            class-mass normalisation (default 1)\n"
            "  --log-level LEVEL        debug|info|warn|error\n",
            CARLS_FMNIST_DIR);
}

/* --worker I/N into the km_opts_t out. */
static int s_arg_worker(const char *prog, const char *name, const char *text, void *out)
{
    km_opts_t *o = out;
    return carls_args_part_value(prog, name, text, 4096, &o->worker, &o->workers);
}

int km_opts_parse(int argc, char **argv, km_opts_t *o)
{
    *o = (km_opts_t){
        .workers = 1,
        .device = "auto",
        .data = "fashion-mnist",
        .prefix = "fmnist",
        .k = 10,
        .poll_ms = 500,
        .labels_per_class = 10,
        .spread_alpha = 0.99f,
        .spread_iters = 30,
        .balance = 1,
        .batch = 4096,
        .wait_embed_ms = 60000,
        .threads = 1,
        .bank_wait_s = 600,
        .metrics_port = -1,
        .metrics_address = "127.0.0.1",
    };
    int task = -1, encoder = 0, source = 0; /* indices in the choices below */
    carls_fmnist_args_t data;
    carls_fmnist_args(&data, &o->data, &o->data_dir, &o->labels_per_class, 1, &o->label_seed);
    kb_curve_args(&o->curve);
    const carls_arg_t args[] = {
        carls_arg_group(data.rows),
        carls_arg_group(o->curve.rows),
        carls_arg_string("kb", &o->kb),
        carls_arg_string("ckpt-dir", &o->ckpt_dir),
        carls_arg_choice("task", &task,
                         (const char *const[]){"embed", "graph", "label", "words", NULL}), /* km_task_t's order */
        carls_arg_custom("worker", o, s_arg_worker),
        carls_arg_string("device", &o->device),
        carls_arg_int("items", &o->items, 0, 100000000),
        carls_arg_string("tables", &o->prefix),
        carls_arg_set("once", &o->once),
        carls_arg_int("poll-ms", &o->poll_ms, 10, 3600000),
        carls_arg_int("threads", &o->threads, 1, 1024),
        carls_arg_choice("encoder", &encoder, (const char *const[]){"model", "pixels", NULL}),
        carls_arg_int("batch", &o->batch, 1, 1 << 20),
        carls_arg_choice("source", &source, (const char *const[]){"pixels", "emb", "emb+pixels", NULL}),
        carls_arg_int("k", &o->k, 1, CARLS_MAX_KNN_K),
        carls_arg_int("wait-embed-ms", &o->wait_embed_ms, 0, 86400000),
        carls_arg_set("wait-graph", &o->wait_graph),
        carls_arg_float("spread-alpha", &o->spread_alpha, 0.0, 0.9999),
        carls_arg_int("spread-iters", &o->spread_iters, 1, 10000),
        carls_arg_float("model-weight", &o->model_weight, 0.0, 1000.0),
        carls_arg_choice("pixel-features", &o->pixel_features,
                         s_pixel_feature_names),
        carls_arg_int("balance", &o->balance, 0, 1),
        carls_arg_log_level(),
        carls_arg_int("bank-timeout-ms", &o->bank_timeout_ms, 10, 3600000),
        carls_arg_int("bank-wait-s", &o->bank_wait_s, 0, 86400 * 30),
        carls_arg_int("metrics-port", &o->metrics_port, 0, 65535),
        carls_arg_string("metrics-address", &o->metrics_address),
        carls_arg_string("gcide-index", &o->gcide_index),
        carls_arg_string("gcide-dict", &o->gcide_dict),
        {0},
    };
    const int rc = carls_args_parse("kb-maker", argc, argv, args, s_usage);
    if (rc != 0) {
        return rc;
    }
    if (kb_curve_args_check(&o->curve, "kb-maker") != 0) {
        return -1;
    }
    o->pixels = encoder == 1;
    o->source_emb = source >= 1;
    o->source_union = source == 2;
    if (!o->kb) {
        fprintf(stderr, "kb-maker: --kb is required\n");
        return -1;
    }
    if (task < 0) {
        fprintf(stderr, "kb-maker: --task is required (embed, graph, label or words)\n");
        return -1;
    }
    o->task = (km_task_t)task;
    bool words_data = strcmp(o->data, "fashion-mnist") == 0 || strcmp(o->data, "gcide") == 0 ||
                      data_pairs_is_spec(o->data); /* the first: --data left at its default */
    if (o->task == KM_TASK_WORDS ? !words_data
                                 : strcmp(o->data, "fashion-mnist") != 0 && !carls_user_data_is_spec(o->data)) {
        fprintf(stderr, "kb-maker: --data '%s' is not supported (fashion-mnist, npy:F.npy,L.npy, csv:F.csv,L.csv; "
                        "--task words: gcide, pairs:P.tsv)\n",
                o->data);
        return -1;
    }
    bool needs_ckpt = (o->task == KM_TASK_EMBED && !o->pixels) || (o->task == KM_TASK_GRAPH && o->source_emb) ||
                      (o->task == KM_TASK_LABEL && !o->once) || o->task == KM_TASK_WORDS;
    if (needs_ckpt && !o->ckpt_dir) {
        fprintf(stderr, "kb-maker: --ckpt-dir is required for this task\n");
        return -1;
    }
    return 0;
}

static const char *s_task_name(km_task_t t)
{
    return t == KM_TASK_EMBED ? "embed" : t == KM_TASK_GRAPH ? "graph" : t == KM_TASK_LABEL ? "label" : "words";
}

static double s_secs(int64_t t0_us)
{
    return (double)(carls_monotonic_us() - t0_us) / 1e6;
}

/* After a failed bank call: S_RETRY when the bank was unreachable (the work is done again once it is back),
 * otherwise -1 with the error logged. */
static int s_bank_failed(s_maker_t *mk)
{
    if (km_bank_unreachable(mk->bank)) {
        return S_RETRY;
    }
    LOG_ERROR("%s", km_bank_error(mk->bank));
    return -1;
}

/* ---- embed ------------------------------------------------------------------------------------------ */

/* Item it's pixel features (--pixel-features; centring is the caller's) into out, dim floats. grad: km_hog's
 * scratch. */
static void s_pixel_row(const s_maker_t *mk, uint32_t it, int dim, float *grad, float *out)
{
    const carls_image_set_t *set = &mk->ds.train;
    const km_pixel_features_t feat = (km_pixel_features_t)mk->o->pixel_features;
    if (feat == KM_PIXELS_HOG) {
        km_hog(set->pixels + (size_t)it * (size_t)set->dim, set->rows, set->cols, grad, out);
        return;
    }
    carls_image_set_batch(set, &it, 1, out, NULL);
    if (feat == KM_PIXELS_SQRT || feat == KM_PIXELS_SQRT_CENTERED || feat == KM_PIXELS_ROOT4_CENTERED) {
        for (int d = 0; d < dim; d++) {
            out[d] = feat == KM_PIXELS_ROOT4_CENTERED ? sqrtf(sqrtf(out[d])) : sqrtf(out[d]);
        }
    }
}

static int s_embed_pixels(s_maker_t *mk)
{
    const carls_image_set_t *set = &mk->ds.train;
    const km_pixel_features_t feat = (km_pixel_features_t)mk->o->pixel_features;
    const int dim = feat == KM_PIXELS_HOG ? km_hog_dim(set->rows, set->cols) : set->dim;
    if (dim == 0) {
        LOG_ERROR("--pixel-features hog needs images of at least %dx%d pixels; this data set's items are %dx%d "
                  "(features of your own data are one row each: use raw, sqrt or centered)",
                  KM_HOG_CELL, KM_HOG_CELL, set->rows, set->cols);
        return -1;
    }
    int64_t t0 = carls_monotonic_us();
    if (km_bank_create_embedding(mk->bank, mk->tables.pixels, (uint32_t)dim) != 0) {
        return s_bank_failed(mk);
    }
    float *x = carls_xmalloc(sizeof(float) * mk->n_share * (size_t)dim);
    float *grad = feat == KM_PIXELS_HOG ? carls_xmalloc(sizeof(float) * 2 * (size_t)set->dim) : NULL;
    for (size_t i = 0; i < mk->n_share; i++) {
        s_pixel_row(mk, mk->share[i], dim, grad, x + i * (size_t)dim);
    }
    if (feat >= KM_PIXELS_CENTERED) {
        /* The mean row over every item (not just the share: the whole fleet subtracts the same one). */
        double *mean = carls_xcalloc((size_t)dim, sizeof *mean);
        float *row = carls_xmalloc(sizeof *row * (size_t)dim);
        for (int it = 0; it < mk->n_items; it++) {
            s_pixel_row(mk, (uint32_t)it, dim, grad, row);
            for (int d = 0; d < dim; d++) {
                mean[d] += row[d];
            }
        }
        for (size_t i = 0; i < mk->n_share; i++) {
            for (int d = 0; d < dim; d++) {
                x[i * (size_t)dim + d] -= (float)(mean[d] / mk->n_items);
            }
        }
        free(row);
        free(mean);
    }
    free(grad);
    int rc = km_bank_put(mk->bank, mk->tables.pixels, mk->share, mk->n_share, (uint32_t)dim, x, 0);
    free(x);
    if (rc != 0) {
        return s_bank_failed(mk);
    }
    double s = s_secs(t0);
    LOG_INFO("embed pixels: %zu items (%s, dim %d) into %s in %.2f s (%.0f items/s)", mk->n_share,
             s_pixel_feature_names[feat], dim, mk->tables.pixels, s, (double)mk->n_share / (s > 0 ? s : 1e-9));
    return 0;
}

/* One checkpoint's embeddings for the share. */
static int s_embed_step(s_maker_t *mk, const carls_ckpt_t *ck)
{
    char err[1024];
    nn_mlp_t *m = NULL;
    const uint64_t step = carls_ckpt_step(ck);
    int64_t t0 = carls_monotonic_us();
    if (nn_mlp_from_ckpt(ck, mk->device, mk->o->batch, &m, err, sizeof err) != 0) {
        LOG_WARN("checkpoint step %" PRIu64 " has no usable encoder: %s", step, err);
        return 0; /* not fatal: keep serving the last good step */
    }
    const int E = m->cfg.hidden[m->cfg.n_hidden - 1];
    float *emb = carls_xmalloc(sizeof(float) * mk->n_share * (size_t)E);
    nn_mlp_encode_u8(m, mk->share_px, (int)mk->n_share, emb, NULL, mk->o->batch);
    double t_enc = s_secs(t0);
    int rc = km_bank_create_embedding(mk->bank, mk->tables.emb, (uint32_t)E);
    if (rc == 0) {
        rc = km_bank_put(mk->bank, mk->tables.emb, mk->share, mk->n_share, (uint32_t)E, emb, step);
    }
    free(emb);
    nn_mlp_destroy(&m);
    if (rc != 0) {
        return s_bank_failed(mk);
    }
    double s = s_secs(t0);
    mk->pass_wait_s = s - t_enc;
    uint64_t latest = km_watch_latest_step(mk->watch);
    LOG_INFO("embed step %" PRIu64 ": %zu items (dim %d) in %.2f s, %.0f items/s (forward %.0f items/s on %s); "
             "trainer's newest checkpoint %" PRIu64 ", %" PRIu64 " steps ahead",
             step, mk->n_share, E, s, (double)mk->n_share / (s > 0 ? s : 1e-9),
             (double)mk->n_share / (t_enc > 0 ? t_enc : 1e-9), nn_device_name(mk->device), latest,
             latest > step ? latest - step : 0);
    return 0;
}

/* ---- graph ------------------------------------------------------------------------------------------ */

/* The share's pixel neighbour lists (k each) from the graph the bank holds: a row of the initial pixel graph
 * (k entries, version 0) or of an earlier union (2k entries, the pixels' second). False when some row is
 * neither, or the bank does not answer: then the caller searches. */
static bool s_pixel_lists_from_graph(s_maker_t *mk, uint32_t k, uint32_t *nbr, float *score)
{
    const size_t n = mk->n_share;
    uint32_t *row = carls_xmalloc(sizeof *row * (n ? n : 1) * 2 * k);
    float *w = carls_xmalloc(sizeof *w * (n ? n : 1) * 2 * k);
    uint64_t *ver = carls_xmalloc(sizeof *ver * (n ? n : 1));
    bool ok = km_bank_get_neighbors(mk->bank, mk->tables.graph, mk->share, n, 2 * k, row, w, ver) == 0;
    for (size_t i = 0; ok && i < n; i++) {
        const uint32_t *r = row + i * 2 * k;
        const bool pixel_row = ver[i] == 0 && r[k - 1] != KM_NO_ITEM && r[k] == KM_NO_ITEM;
        const bool union_row = ver[i] > 0 && r[2 * k - 1] != KM_NO_ITEM;
        ok = pixel_row || union_row;
        memcpy(nbr + i * k, r + (union_row ? k : 0), sizeof *nbr * k);
        memcpy(score + i * k, w + i * 2 * k + (union_row ? k : 0), sizeof *score * k);
    }
    free(row);
    free(w);
    free(ver);
    if (ok) {
        LOG_INFO("graph: the pixels' neighbour lists of %zu items taken from %s", n, mk->tables.graph);
    }
    return ok;
}

/* Builds the share's neighbour lists from the knn over table (k per item), followed by the knn over also when it
 * is not NULL (k more), tagged with version. The learned embeddings' neighbours and the pixels' are on scales
 * that cannot be compared, so the union keeps both lists whole rather than the best k of their merge. */
static int s_graph_build(s_maker_t *mk, const char *table, const char *also, uint64_t version,
                         volatile sig_atomic_t *stop)
{
    const uint32_t k = (uint32_t)mk->o->k, row = also ? 2 * k : k;
    int64_t t0 = carls_monotonic_us();
    int rc = km_bank_create_feature(mk->bank, mk->tables.graph);
    const size_t chunk = 4096;
    uint32_t *nbr = carls_xmalloc(sizeof *nbr * chunk * row), *part = carls_xmalloc(sizeof *part * chunk * k);
    float *score = carls_xmalloc(sizeof *score * chunk * row), *pscore = carls_xmalloc(sizeof *pscore * chunk * k);
    uint64_t same = 0, edges = 0; /* edges between items whose labels are known (-1 labels are not) */
    if (also && !mk->also_nbr && rc == 0) {
        uint32_t *an = carls_xmalloc(sizeof *an * (mk->n_share ? mk->n_share : 1) * k);
        float *as = carls_xmalloc(sizeof *as * (mk->n_share ? mk->n_share : 1) * k);
        /* The pixels' lists are usually in the bank already: the initial graph (k per row), or a union written
         * before this maker restarted (its second k). Searching again costs as much as the initial graph. */
        bool have = s_pixel_lists_from_graph(mk, k, an, as);
        for (size_t off = 0; !have && off < mk->n_share && rc == 0 && !(stop && *stop); off += chunk) {
            size_t m = mk->n_share - off < chunk ? mk->n_share - off : chunk;
            rc = km_bank_knn(mk->bank, also, mk->share + off, m, k, an + off * k, as + off * k);
        }
        if (rc == 0 && !(stop && *stop)) {
            mk->also_nbr = an;
            mk->also_score = as;
        } else {
            free(an);
            free(as);
        }
    }
    for (size_t off = 0; off < mk->n_share && rc == 0; off += chunk) {
        if (stop && *stop) {
            break;
        }
        size_t m = mk->n_share - off < chunk ? mk->n_share - off : chunk;
        rc = km_bank_knn(mk->bank, table, mk->share + off, m, k, part, pscore);
        for (size_t i = 0; rc == 0 && i < m; i++) {
            memcpy(nbr + i * row, part + i * k, sizeof *nbr * k);
            memcpy(score + i * row, pscore + i * k, sizeof *score * k);
            if (also) {
                memcpy(nbr + i * row + k, mk->also_nbr + (off + i) * k, sizeof *nbr * k);
                memcpy(score + i * row + k, mk->also_score + (off + i) * k, sizeof *score * k);
            }
        }
        for (size_t i = 0; rc == 0 && i < m * row; i++) {
            score[i] = score[i] > 0.0f ? score[i] : 0.0f;
            uint32_t t = nbr[i];
            if (t != KM_NO_ITEM && (int)t >= mk->n_items) {
                nbr[i] = KM_NO_ITEM; /* a row that is not one of this run's items */
            } else if (t != KM_NO_ITEM) {
                const uint8_t a = mk->ds.train.labels[t], b = mk->ds.train.labels[mk->share[off + i / row]];
                edges += a != CARLS_LABEL_NONE && b != CARLS_LABEL_NONE;
                same += a != CARLS_LABEL_NONE && a == b;
            }
        }
        if (rc == 0) {
            rc = km_bank_put_neighbors(mk->bank, mk->tables.graph, mk->share + off, m, row, nbr, score, version);
        }
    }
    free(nbr);
    free(score);
    free(part);
    free(pscore);
    if (rc != 0) {
        return s_bank_failed(mk);
    }
    double s = s_secs(t0);
    LOG_INFO("graph from %s%s%s (version %" PRIu64 "): %zu items, %u neighbours each in %.2f s (%.0f items/s); "
             "purity %.4f (share of edges joining items of one class, among items whose class is known: a "
             "diagnostic, never written)",
             table, also ? " + " : "", also ? also : "", version, mk->n_share, row, s,
             (double)mk->n_share / (s > 0 ? s : 1e-9), edges ? (double)same / (double)edges : 0.0);
    return 0;
}

/* Reads the rows a step waits for: sets *oldest, the oldest version among them, and returns 0; or returns -1
 * when the bank failed in a way the caller reports. */
typedef int (*s_versions_fn)(s_maker_t *mk, void *ctx, uint64_t *oldest);

/* Reads until the oldest version reaches step, wait_ms pass or stop is set, polling every poll_ms. Returns 0
 * (with *oldest from the last read), or the reader's -1. */
static int s_wait_for_step(s_maker_t *mk, uint64_t step, int wait_ms, int poll_ms, volatile sig_atomic_t *stop,
                           s_versions_fn read, void *ctx, uint64_t *oldest)
{
    const int64_t deadline = carls_monotonic_ms() + wait_ms;
    for (;;) {
        if (read(mk, ctx, oldest) != 0) {
            return -1;
        }
        if (*oldest >= step || carls_monotonic_ms() >= deadline || (stop && *stop)) {
            return 0;
        }
        usleep((useconds_t)poll_ms * 1000);
    }
}

/* The share's embeddings (their versions only): a row not there yet counts as version 0, and so does a bank
 * that does not answer (the fleet may still be creating the table): keep waiting. */
typedef struct {
    uint32_t E;
    uint64_t *ver;
    int64_t *upd;
} s_emb_versions_t;

static int s_emb_versions(s_maker_t *mk, void *ctx, uint64_t *oldest)
{
    s_emb_versions_t *ev = ctx;
    if (km_bank_lookup(mk->bank, mk->tables.emb, mk->share, mk->n_share, ev->E, NULL, ev->ver, ev->upd) != 0) {
        LOG_DEBUG("waiting for %s: %s", mk->tables.emb, km_bank_error(mk->bank));
        *oldest = 0;
        return 0;
    }
    *oldest = UINT64_MAX;
    for (size_t i = 0; i < mk->n_share; i++) {
        uint64_t v = ev->upd[i] ? ev->ver[i] : 0;
        *oldest = v < *oldest ? v : *oldest;
    }
    return 0;
}

/* The whole graph's neighbour lists (k each, into nbr and w) and their versions. */
typedef struct {
    const uint32_t *all;
    size_t n;
    uint32_t k, *nbr;
    float *w;
    uint64_t *ver;
} s_graph_rows_t;

static int s_graph_versions(s_maker_t *mk, void *ctx, uint64_t *oldest)
{
    s_graph_rows_t *g = ctx;
    if (km_bank_get_neighbors(mk->bank, mk->tables.graph, g->all, g->n, g->k, g->nbr, g->w, g->ver) != 0) {
        return -1;
    }
    *oldest = UINT64_MAX;
    for (size_t i = 0; i < g->n; i++) {
        *oldest = g->ver[i] < *oldest ? g->ver[i] : *oldest;
    }
    return 0;
}

/* graph --source emb for checkpoint step: waits for the embed fleet's step on the share, then rebuilds. */
static int s_graph_step(s_maker_t *mk, const carls_ckpt_t *ck, volatile sig_atomic_t *stop)
{
    const uint64_t step = carls_ckpt_step(ck);
    const carls_ckpt_tensor_t *bias = NULL;
    for (int l = NN_MLP_MAX_HIDDEN - 1; l >= 0 && !bias; l--) {
        char name[32];
        snprintf(name, sizeof name, "enc.%d.bias", l);
        bias = carls_ckpt_find(ck, name);
    }
    if (!bias) {
        LOG_WARN("checkpoint step %" PRIu64 " has no encoder", step);
        return 0;
    }
    if (step == 0) {
        /* An untrained encoder's neighbours are near random (purity about 0.47 against the pixels' 0.84 on
         * Fashion-MNIST): keep the graph the bank has until the trainer has learnt something. */
        LOG_INFO("graph: checkpoint step 0 is the untrained encoder; keeping the graph the bank holds");
        return 0;
    }
    s_emb_versions_t ev = {.E = (uint32_t)bias->numel,
                           .ver = carls_xmalloc(sizeof *ev.ver * (mk->n_share ? mk->n_share : 1)),
                           .upd = carls_xmalloc(sizeof *ev.upd * (mk->n_share ? mk->n_share : 1))};
    uint64_t min_ver = 0;
    s_wait_for_step(mk, step, mk->o->wait_embed_ms, 200, stop, s_emb_versions, &ev, &min_ver);
    free(ev.ver);
    free(ev.upd);
    if (stop && *stop) {
        return 0;
    }
    if (min_ver < step) {
        LOG_WARN("graph: embeddings of step %" PRIu64 " not all there after %d ms (oldest %" PRIu64 "); "
                 "building from what the bank holds",
                 step, mk->o->wait_embed_ms, min_ver);
    }
    return s_graph_build(mk, mk->tables.emb, mk->o->source_union ? mk->tables.pixels : NULL,
                         min_ver == UINT64_MAX ? step : min_ver, stop);
}

/* ---- label ------------------------------------------------------------------------------------------ */

/* Label spreading over the whole graph (with the checkpoint's predictions when ck is not NULL); writes the
 * share's unlabelled items. */
/* Label spreading's prior (n_items, C): model_weight times the checkpoint's class probabilities when it has a
 * usable classifier (else 0), with the n_lab labelled items clamped to their labels. Returns whether the model
 * took part. */
static bool s_label_prior(s_maker_t *mk, const carls_ckpt_t *ck, const uint32_t *labelled, size_t n_lab,
                          float *prior)
{
    const km_opts_t *o = mk->o;
    const size_t n = (size_t)mk->n_items;
    const int C = mk->ds.classes;
    bool with_model = false;
    if (ck && o->model_weight > 0.0f) {
        char err[1024];
        nn_mlp_t *m = NULL;
        if (nn_mlp_from_ckpt(ck, mk->device, o->batch, &m, err, sizeof err) != 0 || m->cfg.num_classes != C) {
            LOG_WARN("checkpoint step %" PRIu64 " has no usable classifier (%s): labels only", carls_ckpt_step(ck),
                     m ? "wrong class count" : err);
        } else {
            float *probs = carls_xmalloc(sizeof *probs * n * (size_t)C);
            nn_mlp_encode_u8(m, mk->ds.train.pixels, (int)n, NULL, probs, o->batch);
            for (size_t i = 0; i < n * (size_t)C; i++) {
                prior[i] = o->model_weight * probs[i];
            }
            free(probs);
            with_model = true;
        }
        nn_mlp_destroy(&m);
    }
    for (size_t i = 0; i < n_lab; i++) {
        float *row = prior + (size_t)labelled[i] * C;
        for (int c = 0; c < C; c++) {
            row[c] = 0.0f;
        }
        row[mk->ds.train.labels[labelled[i]]] = 1.0f;
    }
    return with_model;
}

static int s_label_step(s_maker_t *mk, const carls_ckpt_t *ck, volatile sig_atomic_t *stop)
{
    const km_opts_t *o = mk->o;
    const size_t n = (size_t)mk->n_items;
    const int C = mk->ds.classes;
    const uint32_t k = (uint32_t)o->k;
    const uint64_t step = ck ? carls_ckpt_step(ck) : 0;
    int64_t t0 = carls_monotonic_us();
    int rc = -1;
    uint32_t *all = carls_xmalloc(sizeof *all * n), *labelled = NULL, *nbr = NULL, *items = NULL;
    uint64_t *gver = NULL;
    float *w = NULL, *prior = NULL, *F = NULL, *conf = NULL;
    int32_t *lab = NULL;
    uint8_t *is_lab = NULL;
    carls_iota_u32(all, n);
    const size_t n_lab = (size_t)o->labels_per_class * C;
    labelled = carls_xmalloc(sizeof *labelled * n_lab);
    if (carls_label_subset(mk->ds.train.labels, n, C, o->labels_per_class, (uint64_t)o->label_seed, labelled,
                           NULL) != 0) {
        LOG_ERROR("cannot pick %d labelled images per class among %zu", o->labels_per_class, n);
        goto cleanup;
    }
    is_lab = carls_xcalloc(n, 1);
    for (size_t i = 0; i < n_lab; i++) {
        is_lab[labelled[i]] = 1;
    }
    nbr = carls_xmalloc(sizeof *nbr * n * k);
    w = carls_xmalloc(sizeof *w * n * k);
    gver = carls_xmalloc(sizeof *gver * n);
    /* --wait-graph: the graph fleet rebuilds from this checkpoint's embeddings; spread over that graph, not the
     * one before, so each refresh's labels follow its graph (version: the oldest embedding a row was built on). */
    s_graph_rows_t rows = {.all = all, .n = n, .k = k, .nbr = nbr, .w = w, .ver = gver};
    uint64_t oldest = 0;
    if (s_wait_for_step(mk, step, o->wait_graph && step > 0 ? o->wait_embed_ms : 0, 500, stop, s_graph_versions,
                        &rows, &oldest) != 0) {
        rc = s_bank_failed(mk);
        goto cleanup;
    }
    if (stop && *stop) {
        rc = 0; /* stopped while waiting: no spreading over a graph that may be half rebuilt */
        goto cleanup;
    }
    if (o->wait_graph && step > 0 && oldest < step) {
        LOG_WARN("label step %" PRIu64 ": the graph of this step is not all there after %d ms (oldest row %" PRIu64
                 "); spreading over what the bank holds", step, o->wait_embed_ms, oldest);
    }
    for (size_t i = 0; i < n * k; i++) {
        if (nbr[i] != KM_NO_ITEM && nbr[i] >= n) {
            nbr[i] = KM_NO_ITEM;
        }
    }
    prior = carls_xcalloc(n * (size_t)C, sizeof *prior);
    const bool with_model = s_label_prior(mk, ck, labelled, n_lab, prior);
    F = carls_xmalloc(sizeof *F * n * (size_t)C);
    if (km_spread(nbr, w, n, k, prior, C, o->spread_alpha, o->spread_iters, o->balance, F) != 0) {
        LOG_ERROR("label spreading: bad graph");
        goto cleanup;
    }
    /* The share's unlabelled items. */
    items = carls_xmalloc(sizeof *items * (mk->n_share ? mk->n_share : 1));
    lab = carls_xmalloc(sizeof *lab * (mk->n_share ? mk->n_share : 1));
    conf = carls_xmalloc(sizeof *conf * (mk->n_share ? mk->n_share : 1));
    size_t m_out = 0, right = 0, n_conf = 0, right_conf = 0, known = 0, known_conf = 0;
    for (size_t s = 0; s < mk->n_share; s++) {
        uint32_t it = mk->share[s];
        if (is_lab[it]) {
            continue;
        }
        items[m_out] = it;
        km_spread_labels(F + (size_t)it * C, 1, C, &lab[m_out], &conf[m_out]);
        const bool truth = mk->ds.train.labels[it] < C; /* a user's -1 label: nothing to compare with */
        known += truth;
        right += truth && lab[m_out] == mk->ds.train.labels[it];
        if (conf[m_out] >= 0.5f) {
            n_conf++;
            known_conf += truth;
            right_conf += truth && lab[m_out] == mk->ds.train.labels[it];
        }
        m_out++;
    }
    if (km_bank_create_feature(mk->bank, mk->tables.labels) != 0 ||
        km_bank_put_labels(mk->bank, mk->tables.labels, items, m_out, lab, conf, step) != 0) {
        rc = s_bank_failed(mk);
        goto cleanup;
    }
    double s = s_secs(t0);
    uint64_t latest = mk->watch ? km_watch_latest_step(mk->watch) : 0;
    LOG_INFO("label step %" PRIu64 " (%s): %zu unlabelled items in %.2f s (%.0f items/s); pseudo-label accuracy "
             "%.4f, %.4f on the %.1f%% with confidence >= 0.5 (diagnostics from the true labels, which are never "
             "written); trainer's newest checkpoint %" PRIu64 ", %" PRIu64 " steps ahead",
             step, with_model ? "graph + model" : "graph only", m_out, s, (double)m_out / (s > 0 ? s : 1e-9),
             known ? (double)right / (double)known : 0.0, known_conf ? (double)right_conf / (double)known_conf : 0.0,
             m_out ? 100.0 * (double)n_conf / (double)m_out : 0.0, latest, latest > step ? latest - step : 0);
    rc = 0;
cleanup:
    free(all);
    free(labelled);
    free(is_lab);
    free(nbr);
    free(gver);
    free(w);
    free(prior);
    free(F);
    free(items);
    free(lab);
    free(conf);
    return rc;
}

/* ---- the loop --------------------------------------------------------------------------------------- */

static int s_setup(s_maker_t *mk, const km_opts_t *o)
{
    char err[2048];
    mk->o = o;
    if (km_tables_init(&mk->tables, o->prefix) != 0) {
        LOG_ERROR("--tables '%s': not a usable prefix", o->prefix);
        return -1;
    }
    nn_device_t req;
    if (nn_device_parse(o->device, &req) != 0 || nn_device_resolve(req, &mk->device, err, sizeof err) != 0) {
        LOG_ERROR("--device %s: %s", o->device, nn_device_parse(o->device, &req) != 0 ? "not auto, cpu or cuda" : err);
        return -1;
    }
    nn_cpu_set_threads(o->threads);
    if (carls_dataset_load(o->data, o->data_dir, NULL, &mk->ds, err, sizeof err) != 0) {
        LOG_ERROR("%s", err);
        return -1;
    }
    mk->n_items = o->items > 0 && o->items < mk->ds.train.n ? o->items : mk->ds.train.n;
    mk->share = carls_xmalloc(sizeof *mk->share * ((size_t)mk->n_items / o->workers + 1));
    for (int i = (int)o->worker; i < mk->n_items; i += (int)o->workers) {
        mk->share[mk->n_share++] = (uint32_t)i;
    }
    if (o->task == KM_TASK_EMBED && !o->pixels) {
        const size_t dim = (size_t)mk->ds.train.dim;
        mk->share_px = carls_xmalloc(mk->n_share * dim + 1);
        for (size_t s = 0; s < mk->n_share; s++) {
            memcpy(mk->share_px + s * dim, mk->ds.train.pixels + (size_t)mk->share[s] * dim, dim);
        }
    }
    const int timeout_ms = o->bank_timeout_ms > 0 ? o->bank_timeout_ms : o->task == KM_TASK_EMBED ? 10000 : 60000;
    kb_client_curve_t keys;
    kb_client_options_t copts = {0};
    if (kb_curve_args_options(&o->curve, "kb-maker", &keys, &copts) != 0) {
        return -1;
    }
    mk->bank = km_bank_new(o->kb, timeout_ms, copts.curve);
    explicit_bzero(&keys, sizeof keys);
    if (!mk->bank) {
        return -1;
    }
    if (o->ckpt_dir) {
        mk->watch = km_watch_new(o->ckpt_dir, o->poll_ms);
        if (!mk->watch) {
            return -1;
        }
    }
    LOG_INFO("kb-maker %s: worker %u/%u, %zu of %d items, device %s, bank %s%s%s%s", s_task_name(o->task), o->worker,
             o->workers, mk->n_share, mk->n_items, nn_device_name(mk->device), o->kb,
             mk->watch ? ", watching " : "", mk->watch ? o->ckpt_dir : "",
             mk->watch ? (km_watch_uses_inotify(mk->watch) ? " (inotify)" : " (polling)") : "");
    return 0;
}

static void s_teardown(s_maker_t *mk)
{
    km_watch_destroy(&mk->watch);
    km_bank_destroy(&mk->bank);
    free(mk->share);
    free(mk->share_px);
    free(mk->also_nbr);
    free(mk->also_score);
    carls_fmnist_free(&mk->ds);
}

/* The task once: on ck for the checkpoint tasks (NULL for the others). 0, S_RETRY or -1. */
static int s_task(s_maker_t *mk, const carls_ckpt_t *ck, volatile sig_atomic_t *stop)
{
    const km_opts_t *o = mk->o;
    switch (o->task) {
    case KM_TASK_EMBED: return o->pixels ? s_embed_pixels(mk) : s_embed_step(mk, ck);
    case KM_TASK_GRAPH: return o->source_emb ? s_graph_step(mk, ck, stop) : s_graph_build(mk, mk->tables.pixels, NULL, 0, stop);
    case KM_TASK_LABEL: return s_label_step(mk, ck, stop);
    case KM_TASK_WORDS: break; /* km_words_run, never here */
    }
    return -1;
}

/* Sleeps ms, or less when *stop becomes nonzero. */
static void s_sleep(int ms, volatile sig_atomic_t *stop)
{
    for (int waited = 0; waited < ms && !*stop; waited += 50) {
        usleep(50 * 1000);
    }
}

/* s_task, again and again while the bank is unreachable (killed, restarting): after 0.5 s, then twice as long
 * each time up to 5 s, for at most --bank-wait-s in all. A checkpoint task moves on to a newer checkpoint
 * that arrives meanwhile (*ck is replaced). Every retry is logged and counted. Returns 0, or -1 on a failure
 * or when the bank stayed away too long. */
static int s_do(s_maker_t *mk, carls_ckpt_t **ck, volatile sig_atomic_t *stop)
{
    const km_opts_t *o = mk->o;
    int64_t first_failure = 0;
    int retries = 0, delay_ms = 500;
    for (;;) {
        const int64_t t_pass = carls_monotonic_us();
        mk->pass_wait_s = 0;
        const int r = s_task(mk, ck ? *ck : NULL, stop);
        if (r == 0) {
            carls_prom_progress_add(km_prom, 1, mk->n_share, s_secs(t_pass), mk->pass_wait_s);
            carls_prom_progress_set_step(km_prom, ck && *ck ? (int64_t)carls_ckpt_step(*ck) : 0, 0);
        }
        char what[64];
        if (ck && *ck) {
            snprintf(what, sizeof what, "step %" PRIu64, carls_ckpt_step(*ck));
        } else {
            snprintf(what, sizeof what, "the %s task", s_task_name(o->task));
        }
        if (r != S_RETRY) {
            if (r == 0 && retries) {
                LOG_INFO("bank reachable again: %s done after %d retr%s over %.1f s", what, retries,
                         retries == 1 ? "y" : "ies", (double)(carls_monotonic_ms() - first_failure) / 1000.0);
            }
            return r;
        }
        const int64_t now = carls_monotonic_ms();
        first_failure = first_failure ? first_failure : now;
        if (*stop) {
            return 0;
        }
        if (now - first_failure > (int64_t)o->bank_wait_s * 1000) {
            LOG_ERROR("bank unreachable for %.0f s (--bank-wait-s %d): giving up on %s: %s",
                      (double)(now - first_failure) / 1000.0, o->bank_wait_s, what, km_bank_error(mk->bank));
            return -1;
        }
        retries++;
        mk->bank_retries++;
        LOG_WARN("bank unreachable (%s); retrying %s in %.1f s (retry %d)", km_bank_error(mk->bank), what,
                 delay_ms / 1000.0, retries);
        carls_ckpt_t *newer = NULL;
        char path[4200];
        if (ck && mk->watch && km_watch_next(mk->watch, delay_ms, stop, &newer, path, sizeof path) == 1) {
            LOG_INFO("moving on from %s to the newer checkpoint step %" PRIu64, what, carls_ckpt_step(newer));
            carls_ckpt_destroy(ck);
            *ck = newer;
        } else if (!ck || !mk->watch) {
            s_sleep(delay_ms, stop);
        }
        delay_ms = delay_ms * 2 < 5000 ? delay_ms * 2 : 5000;
    }
}

int km_maker_run(const km_opts_t *o, volatile sig_atomic_t *stop)
{
    if (o->task == KM_TASK_WORDS) {
        return km_words_run(o, stop); /* its own items (GCIDE headwords) and tables */
    }
    s_maker_t mk;
    memset(&mk, 0, sizeof mk);
    int rc = 1;
    if (s_setup(&mk, o) != 0) {
        goto cleanup;
    }
    /* Tasks that need no checkpoint. */
    if ((o->task == KM_TASK_EMBED && o->pixels) || (o->task == KM_TASK_GRAPH && !o->source_emb) ||
        (o->task == KM_TASK_LABEL && o->once && !o->ckpt_dir)) {
        rc = s_do(&mk, NULL, stop) == 0 ? 0 : 1;
        goto cleanup;
    }
    /* The checkpoint loop: every new checkpoint that verifies, until stopped (or once). */
    uint64_t done = 0, last_step = 0;
    while (!*stop) {
        carls_ckpt_t *ck = NULL;
        char path[4200];
        if (km_watch_next(mk.watch, -1, stop, &ck, path, sizeof path) != 1) {
            break;
        }
        LOG_DEBUG("checkpoint %s (step %" PRIu64 ")", path, carls_ckpt_step(ck));
        int r = s_do(&mk, &ck, stop);
        last_step = carls_ckpt_step(ck);
        carls_ckpt_destroy(&ck);
        if (r != 0) {
            goto cleanup;
        }
        done++;
        if (o->once) {
            break;
        }
    }
    LOG_INFO("kb-maker %s worker %u/%u: %" PRIu64 " checkpoints processed (last step %" PRIu64 "), %" PRIu64
             " refused, %" PRIu64 " bank retries; %s",
             s_task_name(o->task), o->worker, o->workers, done, last_step, km_watch_refused(mk.watch),
             mk.bank_retries, *stop ? "stopped by signal" : "done");
    rc = 0;
cleanup:
    s_teardown(&mk);
    return rc;
}
