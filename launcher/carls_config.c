/* A run's settings (see carls_config.h). */
#include "carls_config.h"

#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int s_cfg_check(const carls_config_t *c, char *err, size_t errlen);

/* Reads the run's settings (defaults for the keys the configuration leaves out) and checks them. Returns 0, or
 * -1 with the reason in err. */
static int s_cfg(const carls_ini_t *ini, carls_config_t *c, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    c->name = carls_ini_get(ini, "name", "graphreg");
    c->runs_dir = carls_ini_get(ini, "runs_dir", "runs");
    c->data_dir = carls_ini_get(ini, "data_dir", "");
    c->tables = carls_ini_get(ini, "tables", "fmnist");
    c->hidden = carls_ini_get(ini, "hidden", "256,128");
    c->conv = carls_ini_get(ini, "conv", "none");
    c->neighbors_from = carls_ini_get(ini, "neighbors_from", "bank");
    c->maker_device = carls_ini_get(ini, "maker_device", "auto");
    c->trainer_device = carls_ini_get(ini, "trainer_device", "cpu");
    c->kb_durability = carls_ini_get(ini, "kb_durability", "interval:1000");
    c->curve = carls_ini_get(ini, "curve", "off");
    c->pixel_features = carls_ini_get(ini, "pixel_features", "raw");
    c->data = carls_ini_get(ini, "data", ""); /* empty: the experiment's own (s_cfg_check) */
    c->test_data = carls_ini_get(ini, "test_data", "");
    c->experiment = carls_ini_get(ini, "experiment", "graphreg");
    c->gcide_index = carls_ini_get(ini, "gcide_index", "");
    c->gcide_dict = carls_ini_get(ini, "gcide_dict", "");
    c->negatives_from = carls_ini_get(ini, "negatives_from", "inputs");
    c->negatives_sampling = carls_ini_get(ini, "negatives_sampling", "uniform");
    c->lexical = carls_ini_get(ini, "lexical", "tfidf");
    const char *bin = carls_ini_get(ini, "bin_dir", "");
    if (*bin) {
        carls_fmt(c->bin, sizeof c->bin, "%s", bin);
    } else {
        ssize_t n = readlink("/proc/self/exe", c->bin, sizeof c->bin - 1);
        if (n <= 0) {
            carls_fmt(err, errlen, "cannot find the launcher's own directory; set bin_dir");
            return -1;
        }
        c->bin[n] = '\0';
        char *slash = strrchr(c->bin, '/');
        if (slash) {
            *slash = '\0';
        }
    }
    struct {
        const char *key;
        double *out;
        double def;
    } nums[] = {
        {"items", &c->items, 0},
        {"labels_per_class", &c->labels_per_class, 10},
        {"label_seed", &c->label_seed, 0},
        {"validation", &c->validation, 0},
        {"shards", &c->shards, 1},
        {"replicas", &c->replicas, 1},
        {"min_replicas", &c->min_replicas, -1},
        {"kb_threads", &c->kb_threads, 2},
        {"makers", &c->makers, 2},
        {"graph_k", &c->graph_k, 10},
        {"graph_refresh", &c->graph_refresh, 0},
        {"label_maker", &c->label_maker, 1},
        {"label_model_weight", &c->label_model_weight, 1},
        {"label_balance", &c->label_balance, 1},
        {"spread_alpha", &c->spread_alpha, 0.99},
        {"spread_iters", &c->spread_iters, 30},
        {"alpha", &c->alpha, 0},
        {"beta", &c->beta, 1},
        {"conf_threshold", &c->conf_threshold, 0},
        {"rampup", &c->rampup, 0},
        {"augment_shift", &c->augment_shift, 0},
        {"augment_flip", &c->augment_flip, 0},
        {"neighbors", &c->neighbors, 10},
        {"max_staleness", &c->max_staleness, 0},
        {"neighbor_refresh", &c->neighbor_refresh, 20},
        {"steps", &c->steps, 3000},
        {"batch_labelled", &c->batch_labelled, 100},
        {"batch_unlabelled", &c->batch_unlabelled, 128},
        {"dropout", &c->dropout, 0.2},
        {"lr", &c->lr, 0.001},
        {"ckpt_every", &c->ckpt_every, 100},
        {"eval_every", &c->eval_every, 500},
        {"seed", &c->seed, 1},
        {"timeout_s", &c->timeout_s, 1200},
        {"max_bank_restarts", &c->max_bank_restarts, 3},
        {"max_maker_restarts", &c->max_maker_restarts, 3},
        {"maker_bank_timeout_ms", &c->maker_bank_timeout_ms, 0},
        {"metrics_port", &c->metrics_port, 0},
        {"holdout_seed", &c->holdout_seed, 0},
        {"holdout_count", &c->holdout_count, 2000},
        {"dim", &c->dim, 128},
        {"out_dim", &c->out_dim, 128},
        {"batch", &c->batch, 256},
        {"epochs", &c->epochs, 15},
        {"max_steps", &c->max_steps, 0},
        {"kb_negatives", &c->kb_negatives, 0},
        {"negatives_every", &c->negatives_every, 1},
        {"word_defs", &c->word_defs, 0},
        {"tower_hidden", &c->tower_hidden, 256},
        {"logq", &c->logq, 0},
        {"negatives_shift", &c->negatives_shift, 0},
        {"stale_positives", &c->stale_positives, 0},
        {"temperature", &c->temperature, 0.05},
        {"emb_lr", &c->emb_lr, 0.01},
        {"token_dropout", &c->token_dropout, 0.3},
        {"fuse_tfidf", &c->fuse_tfidf, 0},
        {"bm25_k1", &c->bm25_k1, 1.2},
        {"bm25_b", &c->bm25_b, 0.75},
        {"hard_queries", &c->hard_queries, 0},
        {"hard_k", &c->hard_k, 32},
        {"hard_fresh", &c->hard_fresh, 0},
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        if (carls_ini_get_double(ini, nums[i].key, nums[i].def, nums[i].out, err, errlen) != 0) {
            return -1;
        }
    }
    if (c->min_replicas == -1) { /* the default: no acknowledged write lost with one machine, where it can be */
        c->min_replicas = c->replicas > 1 && strcmp(c->kb_durability, "sync") == 0 ? 1 : 0;
    }
    return s_cfg_check(c, err, errlen);
}

/* The settings a run cannot start with. Returns 0, or -1 with the reason in err. */
static int s_cfg_check(const carls_config_t *c, char *err, size_t errlen)
{
    if (c->shards < 1 || c->shards > CARLS_MAX_SHARDS || c->shards != (double)(int)c->shards) {
        carls_fmt(err, errlen, "shards = %g: need a whole number of kb-servers in 1..%d", c->shards, CARLS_MAX_SHARDS);
        return -1;
    }
    if (strcmp(c->curve, "on") != 0 && strcmp(c->curve, "off") != 0) {
        carls_fmt(err, errlen, "curve = '%s': on or off", c->curve);
        return -1;
    }
    if (c->replicas < 1 || c->replicas > CARLS_MAX_REPLICAS || c->replicas != (double)(int)c->replicas) {
        carls_fmt(err, errlen, "replicas = %g: need a whole number of kb-servers per shard in 1..%d (1: no followers)",
                  c->replicas, CARLS_MAX_REPLICAS);
        return -1;
    }
    if (c->min_replicas < 0 || c->min_replicas > c->replicas - 1 || c->min_replicas != (double)(int)c->min_replicas) {
        carls_fmt(err, errlen, "min_replicas = %g: need a whole number of followers in 0..%d (replicas - 1)",
                  c->min_replicas, (int)c->replicas - 1);
        return -1;
    }
    if (c->min_replicas > 0 && strcmp(c->kb_durability, "sync") != 0) {
        carls_fmt(err, errlen, "min_replicas = %g needs kb_durability = sync (interval durability acknowledges "
                  "before anything is written, so it waits for no follower)", c->min_replicas);
        return -1;
    }
    if (c->graph_refresh != 0 && c->graph_refresh != 1 && c->graph_refresh != 2) {
        carls_fmt(err, errlen, "graph_refresh = %g: need 0 (the pixel graph throughout), 1 (rebuilt from the learned "
              "embeddings) or 2 (learned embeddings' and pixels' neighbours together)", c->graph_refresh);
        return -1;
    }
    if (c->makers < 1 || c->makers > 64) {
        carls_fmt(err, errlen, "makers = %g: need 1..64", c->makers);
        return -1;
    }
    if (c->max_bank_restarts < 0 || c->max_bank_restarts > 1000 || c->max_maker_restarts < 0 ||
        c->max_maker_restarts > 1000) {
        carls_fmt(err, errlen, "max_bank_restarts and max_maker_restarts must be in 0..1000");
        return -1;
    }
    if (strcmp(c->kb_durability, "sync") != 0 && strncmp(c->kb_durability, "interval:", 9) != 0) {
        carls_fmt(err, errlen, "kb_durability = '%s': sync or interval:MS", c->kb_durability);
        return -1;
    }
    if (strcmp(c->experiment, "graphreg") != 0 && strcmp(c->experiment, "twotower") != 0) {
        carls_fmt(err, errlen, "experiment = '%s': graphreg or twotower", c->experiment);
        return -1;
    }
    bool tt = strcmp(c->experiment, "twotower") == 0;
    if (*c->data && (tt ? strcmp(c->data, "gcide") != 0 && strncmp(c->data, "pairs:", 6) != 0
                        : strcmp(c->data, "fashion-mnist") != 0 && strncmp(c->data, "npy:", 4) != 0 &&
                              strncmp(c->data, "csv:", 4) != 0)) {
        carls_fmt(err, errlen, "data = '%s': %s", c->data,
              tt ? "gcide or pairs:PAIRS.tsv[,CANDIDATES.txt]"
                 : "fashion-mnist, npy:FEATURES.npy,LABELS.npy or csv:FEATURES.csv,LABELS.csv");
        return -1;
    }
    if (tt && *c->test_data) {
        carls_fmt(err, errlen, "test_data is for graphreg; twotower holds out one query of holdout_count documents");
        return -1;
    }
    if (c->metrics_port != 0 && (c->metrics_port < 1024 || c->metrics_port > 65535 - CARLS_METRICS_SLOTS)) {
        carls_fmt(err, errlen, "metrics_port = %g: 0 (off) or a base port 1024..%d", c->metrics_port,
              65535 - CARLS_METRICS_SLOTS);
        return -1;
    }
    if (strchr(c->name, '/') || !*c->name) {
        carls_fmt(err, errlen, "name = '%s': must be a plain non-empty name", c->name);
        return -1;
    }
    return 0;
}

void carls_config_metrics_arg(carls_argv_t *a, const carls_config_t *c, int slot)
{
    if (c->metrics_port > 0) {
        carls_argv_add(a, "--metrics-port");
        carls_argv_add(a, "%d", (int)c->metrics_port + slot);
    }
}

void carls_config_write_metrics_targets(const carls_config_t *c, const char *dir, bool tt, bool embed, bool graph,
                                        bool label)
{
    if (c->metrics_port <= 0)
        return;
    char path[4400];
    carls_fmt(path, sizeof path, "%s/prometheus-targets.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) {
        LOG_WARN("cannot write %s", path);
        return;
    }
    const int p = (int)c->metrics_port, n = (int)c->makers;
    fprintf(f, "[\n  {\"targets\": [");
    for (int m = 0; m < (int)c->replicas; m++)
        for (int shard = 0; shard < (int)c->shards; shard++)
            fprintf(f, "%s\"127.0.0.1:%d\"", shard || m ? ", " : "", p + shard + CARLS_MAX_SHARDS * m);
    fprintf(f, "], \"labels\": {\"job\": \"carls-bank\", \"run\": \"%s\"}},\n", c->name);
    fprintf(f, "  {\"targets\": [\"127.0.0.1:%d\"], \"labels\": {\"job\": \"carls-trainer\", \"run\": \"%s\"}},\n",
            p + CARLS_METRICS_TRAINER, c->name);
    fprintf(f, "  {\"targets\": [");
    const char *sep = "";
    for (int i = 0; i < n; i++) {
        const int slots[3] = {embed ? i : -1, graph ? n + i : -1, tt ? 2 * n + i : -1};
        for (int k = 0; k < 3; k++) {
            if (slots[k] >= 0) {
                fprintf(f, "%s\"127.0.0.1:%d\"", sep, p + CARLS_METRICS_MAKERS + slots[k]);
                sep = ", ";
            }
        }
    }
    if (label)
        fprintf(f, "%s\"127.0.0.1:%d\"", sep, p + CARLS_METRICS_MAKERS + 3 * n);
    fprintf(f, "], \"labels\": {\"job\": \"carls-maker\", \"run\": \"%s\"}}\n]\n", c->name);
    fclose(f);
}

/* ---- user data and the settings made for images ------------------------------------------------------
 * A user's data set (data = npy:... or csv:...) is one row of features per item (data/data_user.h), never an
 * image, while experiments/graphreg.ini is tuned on Fashion-MNIST's 28x28 images: HOG features (which need
 * 6x6 pixels or more), a convolutional encoder, shifted and flipped training images. s_fit_user_data turns
 * those off for user data when they come from the configuration file, saying so, and refuses them when they
 * were asked for with --set. */

/* The shape of the features file of user data spec ("npy:F,L" or "csv:F,L") in words into out ("600 x 16" for
 * .npy, "rows of 16 values" for CSV); "" when the file cannot be read (the makers and trainer name the problem
 * when they load it). */
static void s_user_shape(const char *spec, char *out, size_t len)
{
    *out = '\0';
    char path[4096];
    const size_t n = strcspn(spec + 4, ",");
    if (n >= sizeof path) {
        return;
    }
    memcpy(path, spec + 4, n);
    path[n] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f) {
        return;
    }
    char head[4096];
    const size_t got = fread(head, 1, sizeof head - 1, f);
    fclose(f);
    head[got] = '\0';
    if (strncmp(spec, "npy:", 4) == 0) {
        /* The header's dict (after the 10- or 12-byte preamble) holds 'shape': (N, D). */
        const char *shape = got > 10 && memcmp(head, "\x93NUMPY", 6) == 0 ? strstr(head + 10, "'shape':") : NULL;
        const char *open = shape ? strchr(shape, '(') : NULL;
        unsigned long long rows = 0, cols = 0;
        const int k = open ? sscanf(open, "(%llu, %llu)", &rows, &cols) : 0;
        if (k == 2) {
            snprintf(out, len, "%llu x %llu", rows, cols);
        } else if (k == 1) {
            snprintf(out, len, "%llu values, one dimension", rows);
        }
        return;
    }
    /* CSV: the fields of the first line of numbers (a first line that is not numbers is a header). */
    char *line = head;
    char *end = NULL;
    strtod(line, &end);
    if (end == line) {
        line = strchr(head, '\n');
        line = line ? line + 1 : head + got;
    }
    line[strcspn(line, "\r\n")] = '\0';
    if (*line) {
        int fields = 1;
        for (const char *c = line; *c; c++) {
            fields += *c == ',';
        }
        snprintf(out, len, "rows of %d values", fields);
    }
}

/* Index of key in ini, or -1. */
static int s_ini_index(const carls_ini_t *ini, const char *key)
{
    for (int i = 0; i < ini->n; i++) {
        if (strcmp(ini->key[i], key) == 0) {
            return i;
        }
    }
    return -1;
}

/* Graphreg on user data: the image-only settings (above) turned off when the configuration file set them,
 * in one line on stderr (and into note, notelen bytes, for report.md); refused when --set asked for them.
 * Returns 0, or 2 after saying which setting to change. */
static int s_fit_user_data(carls_ini_t *ini, carls_config_t *c, const char *config, char *note, size_t notelen)
{
    *note = '\0';
    const bool user = strncmp(c->data, "npy:", 4) == 0 || strncmp(c->data, "csv:", 4) == 0;
    if (strcmp(c->experiment, "graphreg") != 0 || !user) {
        return 0;
    }
    const struct {
        const char *key;
        bool images;       /* set to something only images can take */
        const char *off;   /* the value that works for any data */
        const char *needs; /* what the setting needs, in words */
        const char *use;   /* what to use instead */
    } image_only[] = {
        {"pixel_features", strcmp(c->pixel_features, "hog") == 0, "centered",
         "images of 6x6 pixels or more (HOG)", "pixel_features = centered, raw or sqrt"},
        {"conv", *c->conv && strcmp(c->conv, "none") != 0, "none", "images (rows x columns of pixels)",
         "conv = none"},
        {"augment_shift", c->augment_shift != 0, "0", "images to shift", "augment_shift = 0"},
        {"augment_flip", c->augment_flip != 0, "0", "images to flip", "augment_flip = 0"},
    };
    char shape[128], data[800];
    s_user_shape(c->data, shape, sizeof shape);
    carls_fmt(data, sizeof data, "data = %.500s holds one row of features per item%s%s%s, not images", c->data,
          *shape ? " (" : "", shape, *shape ? ")" : "");
    char was[512] = "", now[512] = "";
    for (size_t k = 0; k < sizeof image_only / sizeof image_only[0]; k++) {
        const int i = s_ini_index(ini, image_only[k].key);
        if (!image_only[k].images || i < 0) {
            continue;
        }
        if (ini->overridden[i]) {
            fprintf(stderr, "carls: --set %s=%s needs %s, but %s: use %s\n", image_only[k].key, ini->value[i],
                    image_only[k].needs, data, image_only[k].use);
            return 2;
        }
        const size_t w = strlen(was), n = strlen(now);
        snprintf(was + w, sizeof was - w, "%s%s = %s", w ? ", " : "", image_only[k].key, ini->value[i]);
        snprintf(now + n, sizeof now - n, "%s%s = %s", n ? ", " : "", image_only[k].key, image_only[k].off);
        /* The value in place (not marked --set): the settings structure points at it, report.md and run.ini
         * show what ran. */
        carls_fmt(ini->value[i], sizeof ini->value[i], "%s", image_only[k].off);
    }
    if (!*was) {
        return 0;
    }
    c->augment_shift = 0;
    c->augment_flip = 0;
    /* No '|' in it: it becomes a row of report.md's table. */
    snprintf(note, notelen, "%s: %s from %s %s for images, so this run uses %s (other features: --set "
             "pixel_features=raw or sqrt)", data, was, config, strchr(was, ',') ? "are" : "is", now);
    fprintf(stderr, "carls: %s\n", note);
    return 0;
}

int carls_config_load(int argc, char **argv, carls_ini_t *ini, carls_config_t *c, bool *quiet, char *note,
                         size_t notelen)
{
    const char *config = argv[1];
    char err[2048];
    if (carls_ini_load(ini, config, err, sizeof err) != 0) {
        fprintf(stderr, "carls: %s\n", err);
        return 2;
    }
    for (int i = 2; i < argc; i++) {
        const char *assignment = NULL;
        if (strcmp(argv[i], "--set") == 0 && i + 1 < argc) {
            assignment = argv[++i];
        } else if (strncmp(argv[i], "--set=", 6) == 0) {
            assignment = argv[i] + 6;
        } else if (strcmp(argv[i], "--quiet") == 0) {
            *quiet = true;
            continue;
        } else {
            fprintf(stderr, "carls: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
        if (carls_ini_set(ini, assignment, err, sizeof err) != 0) {
            fprintf(stderr, "carls: %s\n", err);
            return 2;
        }
    }
    if (s_cfg(ini, c, err, sizeof err) != 0) {
        fprintf(stderr, "carls: %s: %s\n", config, err);
        return 2;
    }
    return s_fit_user_data(ini, c, config, note, notelen);
}
