/* The experiment launcher (see carls_run.h). */
#include "carls_run.h"

#include "carls_ini.h"
#include "carls_knowledge.h"
#include "carls_proc.h"
#include "carls_ptab.h"
#include "carls_report.h"
#include "carls_resume.h"
#include "carls_slurm.h"
#include "carls_stages.h"

#include "files.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static volatile sig_atomic_t s_interrupted = 0;

static void s_on_signal(int sig)
{
    (void)sig;
    s_interrupted = 1;
}

/* snprintf for paths and names: a result that does not fit is a configuration error caught at once. */
static void s_fmt(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void s_fmt(char *buf, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= len) {
        CARLS_FATAL("launcher: a path or name is too long (%d bytes): %s", n, buf);
    }
}

/* An argv under construction: fixed storage, no allocation. */
typedef struct {
    int n;
    char arg[96][600];
    char *ptr[97];
} s_argv_t;

static void s_arg(s_argv_t *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void s_arg(s_argv_t *a, const char *fmt, ...)
{
    if (a->n >= 96) {
        CARLS_FATAL("launcher: too many arguments");
    }
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(a->arg[a->n], sizeof a->arg[0], fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof a->arg[0]) {
        CARLS_FATAL("launcher: an argument is too long (%d bytes; a path under runs_dir?): %s", n, a->arg[a->n]);
    }
    a->ptr[a->n] = a->arg[a->n];
    a->n++;
    a->ptr[a->n] = NULL;
}

/* Appends every string of the NULL-terminated list. */
static void s_arg_list(s_argv_t *a, const char *const *list)
{
    for (int k = 0; list[k]; k++) {
        s_arg(a, "%s", list[k]);
    }
}

/* Appends flag and value when value is not empty (an optional setting left out of the configuration). */
static void s_arg_if_set(s_argv_t *a, const char *flag, const char *value)
{
    if (*value) {
        s_arg(a, "%s", flag);
        s_arg(a, "%s", value);
    }
}

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

#define S_MAX_SHARDS 16 /* kb-servers of one run (the endpoint list must fit one argument) */
/* metrics_port's slots (s_metrics_arg): the trainer's, the first maker's, and how many there are. */
#define S_METRICS_TRAINER 64
#define S_METRICS_MAKERS 65
#define S_METRICS_SLOTS (S_METRICS_MAKERS + 4 * 64)

/* The run's settings, read from the configuration. */
typedef struct {
    const char *name, *runs_dir, *data_dir, *tables, *hidden, *conv, *neighbors_from, *maker_device, *trainer_device;
    const char *kb_durability;
    const char *curve;                /* on | off: CURVE keys for the whole run */
    const char *pixel_features;       /* the initial graph's pixel features (kb-maker --pixel-features) */
    const char *data, *test_data;     /* graphreg: fashion-mnist or a user's npy:/csv: spec, its test split */
    const char *experiment;           /* graphreg | twotower */
    const char *gcide_index, *gcide_dict, *negatives_from, *negatives_sampling, *lexical;
    char bin[4096];
    double items, labels_per_class, label_seed, validation, kb_threads, makers, graph_k, graph_refresh;
    double label_maker, label_model_weight, label_balance, spread_alpha, spread_iters;
    double augment_shift, augment_flip;
    double alpha, beta, conf_threshold, rampup, neighbors, max_staleness, neighbor_refresh, steps, batch_labelled, batch_unlabelled;
    double dropout, lr, ckpt_every, eval_every, seed, timeout_s, shards;
    double max_bank_restarts, max_maker_restarts;
    double maker_bank_timeout_ms;     /* kb-maker --bank-timeout-ms (0: the maker's default) */
    double metrics_port;              /* > 0: Prometheus /metrics of every long-running process (s_metrics_arg) */
    /* twotower */
    double holdout_seed, holdout_count, dim, out_dim, batch, epochs, max_steps, kb_negatives, negatives_every;
    double word_defs, tower_hidden, logq, negatives_shift, stale_positives, temperature, emb_lr, token_dropout, fuse_tfidf, bm25_k1, bm25_b, hard_queries, hard_k, hard_fresh;
} s_cfg_t;

static int s_cfg_check(const s_cfg_t *c, char *err, size_t errlen);

/* Reads the run's settings (defaults for the keys the configuration leaves out) and checks them. Returns 0, or
 * -1 with the reason in err. */
static int s_cfg(const carls_ini_t *ini, s_cfg_t *c, char *err, size_t errlen)
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
        s_fmt(c->bin, sizeof c->bin, "%s", bin);
    } else {
        ssize_t n = readlink("/proc/self/exe", c->bin, sizeof c->bin - 1);
        if (n <= 0) {
            s_fmt(err, errlen, "cannot find the launcher's own directory; set bin_dir");
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
    return s_cfg_check(c, err, errlen);
}

/* The settings a run cannot start with. Returns 0, or -1 with the reason in err. */
static int s_cfg_check(const s_cfg_t *c, char *err, size_t errlen)
{
    if (c->shards < 1 || c->shards > S_MAX_SHARDS || c->shards != (double)(int)c->shards) {
        s_fmt(err, errlen, "shards = %g: need a whole number of kb-servers in 1..%d", c->shards, S_MAX_SHARDS);
        return -1;
    }
    if (strcmp(c->curve, "on") != 0 && strcmp(c->curve, "off") != 0) {
        s_fmt(err, errlen, "curve = '%s': on or off", c->curve);
        return -1;
    }
    if (c->graph_refresh != 0 && c->graph_refresh != 1 && c->graph_refresh != 2) {
        s_fmt(err, errlen, "graph_refresh = %g: need 0 (the pixel graph throughout), 1 (rebuilt from the learned "
              "embeddings) or 2 (learned embeddings' and pixels' neighbours together)", c->graph_refresh);
        return -1;
    }
    if (c->makers < 1 || c->makers > 64) {
        s_fmt(err, errlen, "makers = %g: need 1..64", c->makers);
        return -1;
    }
    if (c->max_bank_restarts < 0 || c->max_bank_restarts > 1000 || c->max_maker_restarts < 0 ||
        c->max_maker_restarts > 1000) {
        s_fmt(err, errlen, "max_bank_restarts and max_maker_restarts must be in 0..1000");
        return -1;
    }
    if (strcmp(c->kb_durability, "sync") != 0 && strncmp(c->kb_durability, "interval:", 9) != 0) {
        s_fmt(err, errlen, "kb_durability = '%s': sync or interval:MS", c->kb_durability);
        return -1;
    }
    if (strcmp(c->experiment, "graphreg") != 0 && strcmp(c->experiment, "twotower") != 0) {
        s_fmt(err, errlen, "experiment = '%s': graphreg or twotower", c->experiment);
        return -1;
    }
    bool tt = strcmp(c->experiment, "twotower") == 0;
    if (*c->data && (tt ? strcmp(c->data, "gcide") != 0 && strncmp(c->data, "pairs:", 6) != 0
                        : strcmp(c->data, "fashion-mnist") != 0 && strncmp(c->data, "npy:", 4) != 0 &&
                              strncmp(c->data, "csv:", 4) != 0)) {
        s_fmt(err, errlen, "data = '%s': %s", c->data,
              tt ? "gcide or pairs:PAIRS.tsv[,CANDIDATES.txt]"
                 : "fashion-mnist, npy:FEATURES.npy,LABELS.npy or csv:FEATURES.csv,LABELS.csv");
        return -1;
    }
    if (tt && *c->test_data) {
        s_fmt(err, errlen, "test_data is for graphreg; twotower holds out one query of holdout_count documents");
        return -1;
    }
    if (c->metrics_port != 0 && (c->metrics_port < 1024 || c->metrics_port > 65535 - S_METRICS_SLOTS)) {
        s_fmt(err, errlen, "metrics_port = %g: 0 (off) or a base port 1024..%d", c->metrics_port,
              65535 - S_METRICS_SLOTS);
        return -1;
    }
    if (strchr(c->name, '/') || !*c->name) {
        s_fmt(err, errlen, "name = '%s': must be a plain non-empty name", c->name);
        return -1;
    }
    return 0;
}

/* How long a maker waits for one answer before it resends (and so how soon it notices a restarted bank). */
static void s_maker_timeout_arg(s_argv_t *a, const s_cfg_t *c)
{
    if (c->maker_bank_timeout_ms > 0) {
        s_arg(a, "--bank-timeout-ms");
        s_arg(a, "%d", (int)c->maker_bank_timeout_ms);
    }
}

/* One shard of the bank: its kb-server, files and supervision. */
typedef struct {
    int index;                        /* shard index of n_shards */
    char name[32];                    /* "kb-server I/N": its process name (processes.tsv) */
    char what[32];                    /* in messages: "kb-server" (one shard) or its name */
    carls_proc_t proc;
    int row;                          /* its processes.tsv row */
    s_argv_t argv;                    /* its arguments; once it listens, --listen names the bound endpoint */
    int listen_arg;                   /* index of the --listen value in argv */
    char dir[4300];                   /* its data: runs/<name>/kb (one shard) or kb-I */
    char epfile[4300];                /* where it writes its endpoint: kb.endpoint or kb-I.endpoint */
    char log[4400];                   /* logs/kb-server-I.log */
    char endpoint[256];               /* where it listens (the same after every restart) */
    int64_t down_ms;                  /* monotonic time it was found dead; 0 while it is up */
    int64_t wait_deadline;            /* a restarted server must be listening by then; 0: not waiting */
    int restarts;                     /* of this shard (each shard has max_bank_restarts) */
} s_shard_t;

/* metrics_port = P > 0: every long-running process serves Prometheus metrics on a port of its own, P + slot:
 * bank shard s at slot s, the trainer at S_METRICS_TRAINER, the resident makers from S_METRICS_MAKERS on
 * (embed i, graph makers + i, words 2 makers + i, label 3 makers); RUN/prometheus-targets.json lists them for
 * Prometheus's file_sd_configs (docs/EXPERIMENTS.md). One-shot fleets serve none. */
static void s_metrics_arg(s_argv_t *a, const s_cfg_t *c, int slot)
{
    if (c->metrics_port > 0) {
        s_arg(a, "--metrics-port");
        s_arg(a, "%d", (int)c->metrics_port + slot);
    }
}

/* RUN/prometheus-targets.json: the ports s_metrics_arg gives, by job (bank, trainer, maker). */
static void s_write_metrics_targets(const s_cfg_t *c, const char *dir, bool tt, bool embed, bool graph, bool label)
{
    if (c->metrics_port <= 0)
        return;
    char path[4400];
    s_fmt(path, sizeof path, "%s/prometheus-targets.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) {
        LOG_WARN("cannot write %s", path);
        return;
    }
    const int p = (int)c->metrics_port, n = (int)c->makers;
    fprintf(f, "[\n  {\"targets\": [");
    for (int shard = 0; shard < (int)c->shards; shard++)
        fprintf(f, "%s\"127.0.0.1:%d\"", shard ? ", " : "", p + shard);
    fprintf(f, "], \"labels\": {\"job\": \"carls-bank\", \"run\": \"%s\"}},\n", c->name);
    fprintf(f, "  {\"targets\": [\"127.0.0.1:%d\"], \"labels\": {\"job\": \"carls-trainer\", \"run\": \"%s\"}},\n",
            p + S_METRICS_TRAINER, c->name);
    fprintf(f, "  {\"targets\": [");
    const char *sep = "";
    for (int i = 0; i < n; i++) {
        const int slots[3] = {embed ? i : -1, graph ? n + i : -1, tt ? 2 * n + i : -1};
        for (int k = 0; k < 3; k++) {
            if (slots[k] >= 0) {
                fprintf(f, "%s\"127.0.0.1:%d\"", sep, p + S_METRICS_MAKERS + slots[k]);
                sep = ", ";
            }
        }
    }
    if (label)
        fprintf(f, "%s\"127.0.0.1:%d\"", sep, p + S_METRICS_MAKERS + 3 * n);
    fprintf(f, "], \"labels\": {\"job\": \"carls-maker\", \"run\": \"%s\"}}\n]\n", c->name);
    fclose(f);
}

/* A run in progress: its configuration and files, its processes, their supervision and what happened to them. */
typedef struct {
    const s_cfg_t *c;
    const char *config;               /* the configuration file's path */
    const carls_ini_t *ini;           /* its settings (with --set applied), for report.md */
    bool quiet;                       /* --quiet: show no child's lines */
    bool tt;                          /* experiment = twotower */
    bool graph_needed;                /* graphreg with alpha or beta > 0: the bank's graph is built first */
    bool bank_emb;                    /* graphreg: neighbour embeddings come from the embed makers */
    bool embed_fleet;                 /* graphreg: embed makers run (bank_emb, or the graph is refreshed) */
    bool label_loop;                  /* graphreg: a resident label maker */
    bool label_first;                 /* graphreg: a first label-spreading pass over the initial graph */
    bool graph_refresh;               /* graphreg: a resident graph fleet over the learned embeddings */
    /* Files: runs/<name>/ and what it holds. */
    char dir[4200], logs[4300], ckpt[4300], metrics[4300], out[4300], ptab_path[4300];
    int64_t t0;                       /* monotonic start of the run */
    carls_ptab_t ptab;                /* processes.tsv */
    /* The bank: n_shards kb-servers, shard i of n_shards each. */
    int n_shards;
    s_shard_t shard[S_MAX_SHARDS];
    char endpoints[S_MAX_SHARDS * 257]; /* the shards' endpoints in shard order, comma-separated: every client's
                                         * --kb */
    int bank_restarts;                /* restarts of any shard */
    bool bank_lost;                   /* a shard died with no restarts left: the run stops */
    /* curve = on: the run's keys (s_make_keys). */
    bool curve;
    char keys[4300];                  /* runs/<name>/keys (0700) */
    char server_key[4400], server_pub[4400]; /* keys/server.key, .pub: every shard's key pair */
    char client_keys[4400];           /* keys/clients: STEM.key and STEM.pub of every client process; the
                                       * servers' allow-list (they read the .pub files) */
    int n_client_keys;
    /* The resident maker fleet. */
    int n_fleet;
    carls_proc_t fleet[CARLS_PROC_MAX];
    int fleet_row[CARLS_PROC_MAX];
    s_argv_t *fleet_argv;             /* (n_fleet) their arguments, for restarts */
    char fleet_log[CARLS_PROC_MAX][4400];
    int maker_deaths, maker_restarts; /* every maker (one-shot fleets included) */
    /* The trainer. */
    carls_proc_t trainer;
    int trainer_row;
    char snap_prefix[48];             /* its --bank-snapshot prefix (the run's name, carls_resume_prefix) */
    /* --resume RUN_DIR: where the run resumed (s_resume_bank). */
    const char *resume_dir;           /* NULL: a fresh run */
    const char *note;                 /* settings the launcher changed to fit the data ("": none), for report.md */
    const char *restart_dir;          /* --resume of a run with no checkpoint yet: run again from the start in
                                       * this directory, its run.ini kept */
    carls_resume_pair_t resumed;      /* the checkpoint and snapshot it resumed from */
    /* How long each stage took (report.md's table, stages.json); total_s: the whole run's, once measured. */
    carls_stages_t stages;
    double total_s;
    /* What happened, as rows of a markdown table for report.md. */
    char events[8192];
    size_t elen;
} s_run_t;

/* Seconds since the run began. */
static double s_elapsed(const s_run_t *r)
{
    return (double)(carls_monotonic_ms() - r->t0) / 1000.0;
}

/* ---- what each process is given -------------------------------------------------------------------------
 * Every client of the bank (makers, trainer) is named by a stem, which names its log file and, with
 * curve = on, its key: "trainer", "maker-TASK-I" (resident makers), "LABEL-I" (one-shot fleets: pixels-I,
 * graph-I, labels0-0). s_each_client lists the stems of a run; s_bank_client_args gives a process its bank. */

/* The stem of resident maker `task` number i ("maker-embed-0"). */
static void s_resident_stem(char *stem, size_t len, const char *task, int i)
{
    s_fmt(stem, len, "maker-%s-%d", task, i);
}

/* The stem of one-shot fleet `label`'s maker number i ("pixels-1"). */
static void s_once_stem(char *stem, size_t len, const char *label, int i)
{
    s_fmt(stem, len, "%s-%d", label, i);
}

/* Calls fn(r, stem) for every client process the run will start, in the order they start; stops at the
 * first that fails. Returns 0, or what fn returned. Phases 2-4 start exactly these (the same flags decide).
 * The trainer is always listed, also when it runs without the bank (graphreg with alpha = beta = 0): a server
 * refuses an empty allow-list. */
static int s_each_client(s_run_t *r, int (*fn)(s_run_t *r, const char *stem))
{
    const int n = (int)r->c->makers;
    char stem[64];
    int rc = 0;
    for (int i = 0; r->graph_needed && i < n && rc == 0; i++) {
        s_once_stem(stem, sizeof stem, "pixels", i);
        rc = fn(r, stem);
        s_once_stem(stem, sizeof stem, "graph", i);
        rc = rc ? rc : fn(r, stem);
    }
    if (r->label_first && rc == 0) {
        s_once_stem(stem, sizeof stem, "labels0", 0);
        rc = fn(r, stem);
    }
    const struct {
        const char *task;
        bool on;
        int n;
    } resident[] = {{"embed", r->embed_fleet, n}, {"graph", r->graph_refresh, n}, {"words", r->tt, n},
                    {"label", r->label_loop, 1}};
    for (size_t k = 0; k < sizeof resident / sizeof resident[0]; k++) {
        for (int i = 0; resident[k].on && i < resident[k].n && rc == 0; i++) {
            s_resident_stem(stem, sizeof stem, resident[k].task, i);
            rc = fn(r, stem);
        }
    }
    return rc ? rc : fn(r, "trainer");
}

/* The arguments every client of the bank gets: --kb with the shards' endpoints in shard order and, with
 * curve = on, its own secret key (keys/clients/STEM.key, made by s_make_keys) and the servers' public key. */
static void s_bank_client_args(s_argv_t *a, const s_run_t *r, const char *stem)
{
    s_arg_list(a, (const char *const[]){"--kb", r->endpoints, NULL});
    if (r->curve) {
        s_arg(a, "--curve-key");
        s_arg(a, "%s/%s.key", r->client_keys, stem);
        s_arg_list(a, (const char *const[]){"--curve-server-key", r->server_pub, NULL});
    }
}

/* Shard b's kb-server arguments: a free loopback port (--listen is replaced by the bound endpoint once it
 * listens, so a restart comes back on the same one), its data directory, --shard I/N when the bank has
 * several shards and, with curve = on, the run's server key and its clients' allow-list. */
static void s_server_args(s_argv_t *a, const s_run_t *r, s_shard_t *b)
{
    const s_cfg_t *c = r->c;
    s_arg(a, "%s/kb-server", c->bin);
    s_arg(a, "--listen");
    b->listen_arg = a->n;
    s_arg(a, "tcp://127.0.0.1:*");
    s_arg_list(a, (const char *const[]){"--endpoint-file", b->epfile, "--data", b->dir, "--durability",
                                        c->kb_durability, NULL});
    s_arg(a, "--threads");
    s_arg(a, "%d", (int)c->kb_threads);
    s_metrics_arg(a, c, b->index);
    if (r->n_shards > 1) {
        s_arg(a, "--shard");
        s_arg(a, "%d/%d", b->index, r->n_shards);
    }
    if (r->curve) {
        s_arg_list(a, (const char *const[]){"--curve-secret", r->server_key, "--curve-allow", r->client_keys, NULL});
    }
}

/* Common maker arguments: the bank (as maker `stem`), the task and this maker's share. */
static void s_maker_args(s_argv_t *a, const s_run_t *r, const char *stem, const char *task, int worker, int workers)
{
    const s_cfg_t *c = r->c;
    char worker_text[32], items[32];
    s_fmt(worker_text, sizeof worker_text, "%d/%d", worker, workers);
    s_fmt(items, sizeof items, "%d", (int)c->items);
    s_arg(a, "%s/kb-maker", c->bin);
    s_bank_client_args(a, r, stem);
    s_arg_list(a, (const char *const[]){"--task", task, "--worker", worker_text, "--tables", c->tables, "--items",
                                        items, "--device", c->maker_device, NULL});
    s_arg_if_set(a, "--data", c->data);
    s_arg_if_set(a, "--data-dir", c->data_dir);
    s_maker_timeout_arg(a, c);
}

/* Appends a row to the report's fault table. */
static void s_event(s_run_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void s_event(s_run_t *r, const char *fmt, ...)
{
    if (r->elen + 64 >= sizeof r->events) {
        return;
    }
    r->elen += (size_t)snprintf(r->events + r->elen, sizeof r->events - r->elen, "| %.1f | ", s_elapsed(r));
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(r->events + r->elen, sizeof r->events - r->elen, fmt, ap);
    va_end(ap);
    r->elen = n < 0 ? r->elen : r->elen + (size_t)n < sizeof r->events ? r->elen + (size_t)n : sizeof r->events - 1;
    if (r->elen + 3 < sizeof r->events) {
        r->elen += (size_t)snprintf(r->events + r->elen, sizeof r->events - r->elen, " |\n");
    }
}

/* Shard b's kb-server died: restart it with the same flags, data directory and endpoint, unless its
 * max_bank_restarts are used up (then r->bank_lost). Returns 0, or -1 when the run must stop. */
static int s_bank_died(s_run_t *r, s_shard_t *b)
{
    const int max = (int)r->c->max_bank_restarts;
    char how[96];
    carls_proc_describe(&b->proc, how, sizeof how);
    if (!b->down_ms) {
        b->down_ms = carls_monotonic_ms();
    }
    if (b->restarts >= max) {
        LOG_ERROR("%s %s; no restarts left (%d of max_bank_restarts = %d used): stopping the run (see %s)", b->what,
                  how, b->restarts, max, b->log);
        s_event(r, "%s (pid %d) %s; no restarts left: the run stops", b->what, (int)b->proc.started_pid, how);
        carls_ptab_ended(&r->ptab, b->row, &b->proc, "died: not restarted (max_bank_restarts used up)");
        r->bank_lost = true;
        return -1;
    }
    b->restarts++;
    r->bank_restarts++;
    LOG_WARN("%s %s; restarting (%d/%d) on %s with its data in %s", b->what, how, b->restarts, max, b->endpoint,
             b->dir);
    const carls_proc_t dead = b->proc;
    const int dead_row = b->row;
    unlink(b->epfile);
    if (carls_proc_start(&b->proc, b->name, b->argv.ptr, b->log, b->log) != 0) {
        carls_ptab_ended(&r->ptab, dead_row, &dead, "died: the restart failed");
        r->bank_lost = true;
        return -1;
    }
    char note[128];
    s_fmt(note, sizeof note, "died: restarted as pid %d (%d/%d)", (int)b->proc.started_pid, b->restarts, max);
    carls_ptab_ended(&r->ptab, dead_row, &dead, note);
    s_fmt(note, sizeof note, "restart %d/%d of %s (pid %d)", b->restarts, max, b->name, (int)dead.started_pid);
    b->row = carls_ptab_started(&r->ptab, "kb-server", &b->proc, note);
    s_event(r, "%s (pid %d) %s; restarted as pid %d (%d/%d)", b->what, (int)dead.started_pid, how,
            (int)b->proc.started_pid, b->restarts, max);
    b->wait_deadline = carls_monotonic_ms() + 300 * 1000;
    return 0;
}

/* Shard b restarted: once it has written its endpoint file, says so (and that clients reconnect); kills it
 * when it is not listening by its deadline (the next round restarts it again). */
static void s_bank_watch_restart(s_run_t *r, s_shard_t *b)
{
    char ep[256];
    carls_read_first_line(b->epfile, ep, sizeof ep); /* "" until the server has written it */
    if (*ep) {
        const double away = (double)(carls_monotonic_ms() - b->down_ms) / 1000.0;
        if (strcmp(ep, b->endpoint) != 0) {
            LOG_ERROR("the restarted %s listens on %s, not %s: clients cannot find it", b->what, ep, b->endpoint);
        }
        printf("[carls] %s listening again on %s (pid %d), %.1f s after it died; makers and trainer reconnect\n",
               b->what, ep, (int)b->proc.started_pid, away);
        fflush(stdout);
        s_event(r, "%s (pid %d) listening again, %.1f s after it died", b->what, (int)b->proc.started_pid, away);
        b->wait_deadline = 0;
        b->down_ms = 0;
    } else if (carls_monotonic_ms() > b->wait_deadline) {
        LOG_ERROR("the restarted %s (pid %d) is not listening after 300 s: killing it (see %s)", b->what,
                  (int)b->proc.started_pid, b->log);
        kill(b->proc.pid, SIGKILL);
        b->wait_deadline = 0;
    }
}

/* A resident maker (fleet[i]) died: count it, and restart it unless max_maker_restarts are used up. */
static void s_maker_died(s_run_t *r, int i)
{
    const int max = (int)r->c->max_maker_restarts;
    carls_proc_t *p = &r->fleet[i];
    char how[96], note[128];
    carls_proc_describe(p, how, sizeof how);
    r->maker_deaths++;
    if (r->maker_restarts >= max) {
        LOG_WARN("%s %s; not restarted (%d of max_maker_restarts = %d used): the other makers and the trainer "
                 "carry on (see %s)",
                 p->name, how, r->maker_restarts, max, r->fleet_log[i]);
        s_event(r, "%s (pid %d) %s; not restarted, the others carry on", p->name, (int)p->started_pid, how);
        carls_ptab_ended(&r->ptab, r->fleet_row[i], p, "died: not restarted (max_maker_restarts used up)");
        return;
    }
    r->maker_restarts++;
    LOG_WARN("%s %s; restarting it (%d/%d); the other makers and the trainer carry on", p->name, how,
             r->maker_restarts, max);
    const carls_proc_t dead = *p;
    char name[64];
    s_fmt(name, sizeof name, "%s", p->name);
    if (carls_proc_start(p, name, r->fleet_argv[i].ptr, r->fleet_log[i], r->fleet_log[i]) != 0) {
        *p = dead; /* not running: nothing more to supervise */
        carls_ptab_ended(&r->ptab, r->fleet_row[i], &dead, "died: the restart failed");
        return;
    }
    s_fmt(note, sizeof note, "died: restarted as pid %d (%d/%d)", (int)p->started_pid, r->maker_restarts, max);
    carls_ptab_ended(&r->ptab, r->fleet_row[i], &dead, note);
    s_fmt(note, sizeof note, "restart %d/%d (pid %d died)", r->maker_restarts, max, (int)dead.started_pid);
    r->fleet_row[i] = carls_ptab_started(&r->ptab, "maker", p, note);
    s_event(r, "%s (pid %d) %s; restarted as pid %d (%d/%d)", name, (int)dead.started_pid, how, (int)p->started_pid,
            r->maker_restarts, max);
}

/* One round of supervision, called from every waiting loop: the bank's shards (each restarted when it died,
 * watched until it listens again) and the resident makers. Returns 0, or -1 when the bank is gone for good. */
static int s_supervise(s_run_t *r)
{
    if (r->bank_lost) {
        return -1;
    }
    for (int i = 0; i < r->n_shards; i++) {
        s_shard_t *b = &r->shard[i];
        if (b->proc.running && carls_proc_poll(&b->proc) && s_bank_died(r, b) != 0) {
            return -1;
        }
        if (b->wait_deadline && b->proc.running) {
            s_bank_watch_restart(r, b);
        }
    }
    for (int i = 0; i < r->n_fleet; i++) {
        if (r->fleet[i].running && carls_proc_poll(&r->fleet[i])) {
            s_maker_died(r, i);
        }
    }
    return 0;
}

/* One-shot maker p (processes.tsv row *row, argv a, log file log) has ended: finished, restarted when a
 * signal killed it (within max_maker_restarts, while the phase has not failed: *rc == 0), else failed
 * (*rc = -1). Returns whether it runs again. */
static bool s_once_ended(s_run_t *r, carls_proc_t *p, int *row, const s_argv_t *a, const char *log, int *rc)
{
    const int max = (int)r->c->max_maker_restarts;
    char how[96];
    carls_proc_describe(p, how, sizeof how);
    if (p->status == 0) {
        carls_ptab_ended(&r->ptab, *row, p, "finished");
        return false;
    }
    if (p->signal && !s_interrupted && *rc == 0 && r->maker_restarts < max) {
        r->maker_deaths++;
        r->maker_restarts++;
        LOG_WARN("%s %s; restarting it (%d/%d)", p->name, how, r->maker_restarts, max);
        const carls_proc_t dead = *p;
        char name[64], note[128];
        s_fmt(name, sizeof name, "%s", dead.name);
        if (carls_proc_start(p, name, a->ptr, log, log) != 0) {
            *p = dead;
            carls_ptab_ended(&r->ptab, *row, &dead, "died: the restart failed");
            *rc = -1;
            return false;
        }
        s_fmt(note, sizeof note, "died: restarted as pid %d (%d/%d)", (int)p->started_pid, r->maker_restarts, max);
        carls_ptab_ended(&r->ptab, *row, &dead, note);
        *row = carls_ptab_started(&r->ptab, "maker", p, "one-shot, restarted");
        s_event(r, "%s (pid %d) %s; restarted as pid %d (%d/%d)", name, (int)dead.started_pid, how,
                (int)p->started_pid, r->maker_restarts, max);
        return true;
    }
    if (p->signal && !s_interrupted) {
        r->maker_deaths++;
    }
    if (!s_interrupted) {
        LOG_ERROR("%s %s (see %s)", p->name, how, log);
    }
    carls_ptab_ended(&r->ptab, *row, p, s_interrupted ? "stopped by the launcher" : "failed");
    *rc = -1;
    return false;
}

/* Runs a fleet of `n` one-shot makers to completion, supervising the bank meanwhile. A maker killed by a
 * signal is started again (within max_maker_restarts); one that fails on its own fails the phase. Returns 0,
 * or -1 when one failed, the bank is gone or we were stopped. */
static int s_fleet_once(s_run_t *r, const char *label, const char *task, int n, const char *const *extra,
                        double *seconds)
{
    carls_proc_t p[CARLS_PROC_MAX];
    int row[CARLS_PROC_MAX];
    s_argv_t *a = carls_xcalloc((size_t)n, sizeof *a);
    char (*log)[4400] = carls_xcalloc((size_t)n, sizeof *log);
    int64_t t0 = carls_monotonic_ms();
    int started = 0, rc = 0;
    for (int i = 0; i < n; i++) {
        char stem[64];
        s_once_stem(stem, sizeof stem, label, i);
        s_maker_args(&a[i], r, stem, task, i, n);
        s_arg(&a[i], "--once");
        for (int e = 0; extra && extra[e]; e++) {
            s_arg(&a[i], "%s", extra[e]);
        }
        char name[64];
        s_fmt(name, sizeof name, "%s %d/%d", label, i, n);
        s_fmt(log[i], sizeof log[0], "%s/%s.log", r->logs, stem);
        if (carls_proc_start(&p[started], name, a[i].ptr, log[i], log[i]) != 0) {
            rc = -1;
            break;
        }
        row[started] = carls_ptab_started(&r->ptab, "maker", &p[started], "one-shot");
        started++;
    }
    for (;;) {
        bool running = false;
        for (int i = 0; i < started; i++) {
            if (!p[i].running || !carls_proc_poll(&p[i])) {
                running = running || p[i].running;
                continue;
            }
            running = s_once_ended(r, &p[i], &row[i], &a[i], log[i], &rc) || running;
        }
        if (!running) {
            break;
        }
        if (s_supervise(r) != 0 || s_interrupted || rc != 0) {
            for (int i = 0; i < started; i++) {
                if (p[i].running) {
                    carls_proc_stop(&p[i], 5000);
                    carls_ptab_ended(&r->ptab, row[i], &p[i], "stopped by the launcher");
                }
            }
            rc = -1;
            break;
        }
        usleep(100 * 1000);
    }
    free(a);
    free(log);
    *seconds = (double)(carls_monotonic_ms() - t0) / 1000.0;
    printf("[carls] %s: %d maker%s in %.1f s%s\n", label, n, n == 1 ? "" : "s", *seconds, rc ? " (FAILED)" : "");
    fflush(stdout);
    return s_interrupted ? -1 : rc;
}

/* Starts resident maker number r->n_fleet with argv a (copied) and log file log. */
static int s_fleet_start(s_run_t *r, const char *name, const s_argv_t *a, const char *log)
{
    const int i = r->n_fleet;
    r->fleet_argv[i] = *a;
    for (int k = 0; k < a->n; k++) {
        r->fleet_argv[i].ptr[k] = r->fleet_argv[i].arg[k];
    }
    s_fmt(r->fleet_log[i], sizeof r->fleet_log[0], "%s", log);
    if (carls_proc_start(&r->fleet[i], name, r->fleet_argv[i].ptr, log, log) != 0) {
        return -1;
    }
    r->fleet_row[i] = carls_ptab_started(&r->ptab, "maker", &r->fleet[i], NULL);
    r->n_fleet++;
    return 0;
}

/* A numeric option for a child: flag and value, printed as an integer or with %g. */
typedef struct {
    const char *flag;
    double v;
    int is_int;
} s_num_arg_t;

static void s_num_args(s_argv_t *a, const s_num_arg_t *nums, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        s_arg(a, "%s", nums[i].flag);
        if (nums[i].is_int) {
            s_arg(a, "%d", (int)nums[i].v);
        } else {
            s_arg(a, "%g", nums[i].v);
        }
    }
}

/* trainer graphreg's arguments (experiment = graphreg). */
static void s_graphreg_args(s_argv_t *a, const s_run_t *r)
{
    const s_cfg_t *c = r->c;
    s_arg_list(a, (const char *const[]){"graphreg", "--data", *c->data ? c->data : "fashion-mnist", NULL});
    s_arg_if_set(a, "--data-dir", c->data_dir);
    s_arg_if_set(a, "--test-data", c->test_data);
    if (r->graph_needed) {
        s_bank_client_args(a, r, "trainer");
    }
    const s_num_arg_t nums[] = {
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
    s_num_args(a, nums, sizeof nums / sizeof nums[0]);
    s_arg_list(a, (const char *const[]){"--hidden", c->hidden, "--conv", c->conv, "--neighbors-from", c->neighbors_from, "--tables",
                                        c->tables, "--ckpt-dir", r->ckpt, "--metrics", r->metrics, "--device",
                                        c->trainer_device, NULL});
    /* Each checkpoint with the bank's snapshot of the same step; the newest 2 pairs kept (--resume). */
    if (r->graph_needed) {
        s_arg_list(a, (const char *const[]){"--bank-snapshot", r->snap_prefix, "--keep", "2", NULL});
    }
    if (r->resume_dir) {
        s_arg(a, "--resume");
    }
}

/* trainer twotower's arguments (experiment = twotower): the word vectors come from the maker fleet. */
static void s_twotower_args(s_argv_t *a, const s_run_t *r, const char *vectors)
{
    const s_cfg_t *c = r->c;
    s_arg(a, "twotower");
    s_bank_client_args(a, r, "trainer");
    const char *const fixed[] = {"--data", *c->data ? c->data : "gcide", "--table", c->tables, "--ckpt-dir", r->ckpt,
                                 "--metrics", r->metrics, "--vectors", "makers", "--negatives-from", c->negatives_from,
                                 "--negatives-sampling", c->negatives_sampling,
                                 "--lexical", c->lexical, "--save-vectors", vectors, NULL};
    s_arg_list(a, fixed);
    s_arg_if_set(a, "--index", c->gcide_index);
    s_arg_if_set(a, "--dict", c->gcide_dict);
    const s_num_arg_t nums[] = {
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
    s_num_args(a, nums, sizeof nums / sizeof nums[0]);
    /* Each checkpoint with the bank's snapshot of the same step (the rows it trains live there); the newest 2
     * pairs kept (--resume). */
    s_arg_list(a, (const char *const[]){"--bank-snapshot", r->snap_prefix, "--keep", "2", NULL});
    if (r->resume_dir) {
        s_arg(a, "--resume");
    }
}

/* The rest of the result line: each of the trainer's values named in show (NULL-terminated) that it printed,
 * then the run's fault counts and wall time. */
static void s_print_result_line(const s_run_t *r, const carls_result_t *res, const char *const *show, double wall)
{
    for (int i = 0; show[i]; i++) {
        const double *x = carls_result_get(res, show[i]);
        if (x) {
            printf("%s=%.6g ", show[i], *x);
        }
    }
    printf("shards=%d curve=%d bank_restarts=%d maker_deaths=%d maker_restarts=%d wall_s=%.1f\n", r->n_shards,
           r->curve ? 1 : 0, r->bank_restarts, r->maker_deaths, r->maker_restarts, wall);
}

/* Prints the two-tower run's result line; returns the launcher's status. */
static int s_twotower_result(const s_run_t *r, const carls_result_t *res, int plotted, double wall)
{
    const char *show[] = {"r1", "r10", "r100", "median_rank", "mrr", "n", "fused_r1", "fused_r10", "fused_r100",
                          "fused_median_rank", "fused_mrr", "train_steps", "train_steps_per_s", "kb_negatives",
                          "neg_staleness_steps", "neg_unavailable", "hard_per_step", "hard_staleness_steps",
                          "hard_unavailable", "neg_vector_cos", "neg_shifted_vector_cos", "neg_shift_ratio", "knn_agree", NULL};
    if (!carls_result_get(res, "r10")) {
        LOG_ERROR("the trainer printed no r10 (see %s)", r->out);
        return 1;
    }
    printf("[carls] report: %s/report.md, metrics: %s%s, processes: %s\n", r->dir, r->metrics,
           plotted ? ", plots: loss.png staleness.png" : "", r->ptab_path);
    s_print_result_line(r, res, show, wall);
    return 0;
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
static int s_fit_user_data(carls_ini_t *ini, s_cfg_t *c, const char *config, char *note, size_t notelen)
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
    s_fmt(data, sizeof data, "data = %.500s holds one row of features per item%s%s%s, not images", c->data,
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
        s_fmt(ini->value[i], sizeof ini->value[i], "%s", image_only[k].off);
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

/* Reads CONFIG (argv[1]) into ini, applies --set key=value (or --set=key=value) and --quiet, and checks the
 * settings into *c. Returns 0, or the exit status (2) after reporting the problem. */
static int s_load_config(int argc, char **argv, carls_ini_t *ini, s_cfg_t *c, bool *quiet, char *note,
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

/* Names the run's files and gives it a fresh directory: the bank, checkpoints and logs of an earlier run with
 * this name go, and run.ini records the settings (for --resume). With --resume the directory is the one given
 * and its files stay (logs and trainer.out are appended to; processes.tsv is kept as
 * processes.before-resume.tsv); only the keys are made anew. Returns 0, or -1 after reporting. */
static int s_prepare_dir(s_run_t *r)
{
    const s_cfg_t *c = r->c;
    if (r->resume_dir || r->restart_dir) {
        s_fmt(r->dir, sizeof r->dir, "%s", r->resume_dir ? r->resume_dir : r->restart_dir);
    } else {
        s_fmt(r->dir, sizeof r->dir, "%s/%s", c->runs_dir, c->name);
    }
    carls_resume_prefix(c->name, r->snap_prefix, sizeof r->snap_prefix);
    s_fmt(r->logs, sizeof r->logs, "%s/logs", r->dir);
    s_fmt(r->ckpt, sizeof r->ckpt, "%s/ckpt", r->dir);
    s_fmt(r->metrics, sizeof r->metrics, "%s/metrics.csv", r->dir);
    s_fmt(r->out, sizeof r->out, "%s/trainer.out", r->dir);
    s_fmt(r->ptab_path, sizeof r->ptab_path, "%s/processes.tsv", r->dir);
    s_fmt(r->keys, sizeof r->keys, "%s/keys", r->dir);
    s_fmt(r->server_key, sizeof r->server_key, "%s/server.key", r->keys);
    s_fmt(r->server_pub, sizeof r->server_pub, "%s/server.pub", r->keys);
    s_fmt(r->client_keys, sizeof r->client_keys, "%s/clients", r->keys);
    r->curve = strcmp(c->curve, "on") == 0;
    r->n_shards = (int)c->shards;
    for (int i = 0; i < r->n_shards; i++) {
        s_shard_t *b = &r->shard[i];
        b->index = i;
        s_fmt(b->name, sizeof b->name, "kb-server %d/%d", i, r->n_shards);
        s_fmt(b->what, sizeof b->what, "%s", r->n_shards == 1 ? "kb-server" : b->name);
        s_fmt(b->log, sizeof b->log, "%s/kb-server-%d.log", r->logs, i);
        if (r->n_shards == 1) {
            s_fmt(b->dir, sizeof b->dir, "%s/kb", r->dir);
            s_fmt(b->epfile, sizeof b->epfile, "%s/kb.endpoint", r->dir);
        } else {
            s_fmt(b->dir, sizeof b->dir, "%s/kb-%d", r->dir, i);
            s_fmt(b->epfile, sizeof b->epfile, "%s/kb-%d.endpoint", r->dir, i);
        }
    }
    /* Whatever an earlier run of this name left, whatever its number of shards. */
    char cmd[9000];
    if (r->resume_dir) {
        s_fmt(cmd, sizeof cmd, "cd '%s' && rm -rf keys && { [ ! -e processes.tsv ] || mv -f processes.tsv "
              "processes.before-resume.tsv; }", r->dir);
    } else {
        /* A restart keeps run.ini: it is the configuration being run. */
        s_fmt(cmd, sizeof cmd, "cd '%s' 2>/dev/null || exit 0; rm -rf kb kb.endpoint kb-[0-9]* ckpt logs keys "
              "metrics.csv trainer.out processes.tsv processes.before-resume.tsv %s", r->dir,
              r->restart_dir ? "" : CARLS_RESUME_SETTINGS);
    }
    if (system(cmd) != 0 || carls_mkdir_p(r->logs, 0755, NULL, 0) != 0) {
        fprintf(stderr, "carls: cannot prepare %s\n", r->dir);
        return -1;
    }
    char settings[4400], err[1024];
    s_fmt(settings, sizeof settings, "%s/%s", r->dir, CARLS_RESUME_SETTINGS);
    if (!r->resume_dir && !r->restart_dir &&
        carls_resume_write_settings(settings, r->config, r->ini, err, sizeof err) != 0) {
        fprintf(stderr, "carls: %s\n", err);
        return -1;
    }
    return 0;
}

/* What this run will do, in one line. */
static void s_print_plan(const s_run_t *r)
{
    const s_cfg_t *c = r->c;
    if (r->tt) {
        printf("[carls] run %s: %s, two-tower reverse dictionary on GCIDE, hold-out seed %g, %g bank negatives, "
               "%d word-tower makers, results in %s\n",
               c->name, r->config, c->holdout_seed, c->kb_negatives, (int)c->makers, r->dir);
    } else {
        printf("[carls] run %s: %s, label seed %g, %s%s, results in %s\n", c->name, r->config, c->label_seed,
               r->graph_needed ? "graph from the bank" : "supervised only (alpha = beta = 0)",
               r->bank_emb ? ", neighbour embeddings from the maker fleet" : "", r->dir);
    }
    fflush(stdout);
}

/* Runs `kb-keygen PATH` (PATH.key, mode 0600, and PATH.pub), its output in logs/keygen.log. 0 or -1 (logged). */
static int s_keygen(s_run_t *r, const char *path)
{
    char prog[4200], log[4400];
    s_fmt(prog, sizeof prog, "%s/kb-keygen", r->c->bin);
    s_fmt(log, sizeof log, "%s/keygen.log", r->logs);
    char *const argv[] = {prog, (char *)path, NULL};
    carls_proc_t p;
    if (carls_proc_start(&p, "kb-keygen", argv, log, log) != 0) {
        return -1;
    }
    carls_proc_wait(&p, -1);
    if (p.status != 0) {
        LOG_ERROR("kb-keygen %s failed (see %s)", path, log);
        return -1;
    }
    return 0;
}

/* s_each_client's callback: the key pair of client `stem`. */
static int s_make_client_key(s_run_t *r, const char *stem)
{
    char path[4500];
    s_fmt(path, sizeof path, "%s/%s", r->client_keys, stem);
    r->n_client_keys++;
    return s_keygen(r, path);
}

/* curve = on: the run's keys, made before any server starts (a server reads its allow-list once):
 * keys/server.key and .pub (every shard's pair) and keys/clients/STEM.key and .pub for each client process
 * (s_each_client). The directories are 0700 and the secret keys 0600; a process is given only its own
 * secret key, and the servers admit exactly the public keys in keys/clients. Returns 0 or -1 (logged). */
static int s_make_keys(s_run_t *r)
{
    char err[512];
    if (carls_mkdir_p(r->client_keys, 0700, err, sizeof err) != 0 || chmod(r->keys, 0700) != 0 ||
        chmod(r->client_keys, 0700) != 0) {
        LOG_ERROR("cannot make %s: %s", r->client_keys, *err ? err : strerror(errno));
        return -1;
    }
    char server[4400];
    s_fmt(server, sizeof server, "%s/server", r->keys);
    const int64_t t0 = carls_monotonic_ms();
    const int rc = s_keygen(r, server) != 0 || s_each_client(r, s_make_client_key) != 0 ? -1 : 0;
    carls_stages_add(&r->stages, "curve_keys", (double)(carls_monotonic_ms() - t0) / 1000.0,
                     "CURVE keys: kb-keygen for the servers and %d clients%s", r->n_client_keys,
                     rc ? " (failed)" : "");
    if (rc != 0) {
        return -1;
    }
    printf("[carls] CURVE: a server key pair and %d client keys in %s; the servers admit only those clients\n",
           r->n_client_keys, r->keys);
    return 0;
}

/* 1. The bank: n_shards kb-servers, each on a free loopback port; waits until every one listens, then
 * names the endpoint list every client gets. A restart (s_bank_died) reuses a shard's arguments with
 * --listen set to its bound endpoint. Returns 0 or -1. */
static int s_start_bank(s_run_t *r, const char *restore)
{
    const s_cfg_t *c = r->c;
    r->endpoints[0] = '\0';
    for (int i = 0; i < r->n_shards; i++) {
        s_shard_t *b = &r->shard[i];
        memset(&b->argv, 0, sizeof b->argv);
        b->endpoint[0] = '\0';
        unlink(b->epfile); /* a killed run's: not this server's */
        s_server_args(&b->argv, r, b);
        /* --restore only for this start: a restart later must not go back to the snapshot. */
        s_argv_t *first = &b->argv, *with = NULL;
        if (restore) {
            with = carls_xmalloc(sizeof *with);
            *with = b->argv;
            for (int k = 0; k < with->n; k++) {
                with->ptr[k] = with->arg[k];
            }
            s_arg_list(with, (const char *const[]){"--restore", restore, NULL});
            first = with;
        }
        const int started = carls_proc_start(&b->proc, b->name, first->ptr, b->log, b->log);
        free(with);
        if (started != 0) {
            return -1;
        }
        b->row = carls_ptab_started(&r->ptab, "kb-server", &b->proc, restore ? "--restore" : NULL);
    }
    for (int i = 0; i < r->n_shards; i++) {
        s_shard_t *b = &r->shard[i];
        for (int t = 0; t < 600 && !s_interrupted && !*b->endpoint; t++) {
            carls_read_first_line(b->epfile, b->endpoint, sizeof b->endpoint);
            if (*b->endpoint || carls_proc_poll(&b->proc)) {
                break;
            }
            usleep(50 * 1000);
        }
        if (!*b->endpoint) {
            LOG_ERROR("%s did not start (see %s)", b->what, b->log);
            return -1;
        }
        size_t used = strlen(r->endpoints);
        if (used + strlen(b->endpoint) + 2 > sizeof b->argv.arg[0] || used + strlen(b->endpoint) + 2 > sizeof r->endpoints) {
            LOG_ERROR("the shards' endpoint list is too long for one argument at %s (%s)", b->name, b->endpoint);
            return -1;
        }
        snprintf(r->endpoints + used, sizeof r->endpoints - used, "%s%s", i ? "," : "", b->endpoint);
        memcpy(b->argv.arg[b->listen_arg], b->endpoint, strlen(b->endpoint) + 1);
    }
    if (r->n_shards == 1) {
        printf("[carls] kb-server listening on %s", r->endpoints);
    } else {
        printf("[carls] bank of %d shards (kb-server --shard I/%d) listening on %s", r->n_shards, r->n_shards,
               r->endpoints);
    }
    printf("%s (each restarted on the same endpoint and data if it dies, up to %d times)\n",
           r->curve ? ", CURVE only" : "", (int)c->max_bank_restarts);
    return 0;
}

/* The bank in words, for the stage table: "1 kb-server", "2 kb-servers (shards), CURVE (a key per process)". */
static const char *s_bank_words(const s_run_t *r, char *buf, size_t len)
{
    s_fmt(buf, len, "%d kb-server%s%s", r->n_shards, r->n_shards == 1 ? "" : "s (shards)",
          r->curve ? ", CURVE (a key per process)" : "");
    return buf;
}

/* The last non-empty line of path into out (len bytes; "" when there is none). */
static void s_last_line_of(const char *path, char *out, size_t len)
{
    *out = '\0';
    FILE *f = fopen(path, "r");
    char line[1024];
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        if (*line) {
            snprintf(out, len, "%s", line);
        }
    }
    if (f) {
        fclose(f);
    }
}

/* Stops the shards that s_start_bank started (one refused its --restore), noting why in processes.tsv; the
 * reason each exited shard gave (its log's last line) is appended to why (whylen bytes). */
static void s_stop_bank(s_run_t *r, const char *snapshot, char *why, size_t whylen)
{
    for (int i = 0; i < r->n_shards; i++) {
        s_shard_t *b = &r->shard[i];
        if (b->proc.running && !carls_proc_poll(&b->proc)) {
            carls_proc_stop(&b->proc, 10000);
            carls_ptab_ended(&r->ptab, b->row, &b->proc, "stopped: another shard refused the snapshot");
        } else if (b->proc.started_pid && b->row >= 0) {
            char line[1100];
            s_last_line_of(b->log, line, sizeof line);
            const size_t used = strlen(why);
            snprintf(why + used, whylen - used, "%s refused snapshot %s: %s (see %s)\n", b->what, snapshot,
                     *line ? line : "no reason logged", b->log);
            carls_ptab_ended(&r->ptab, b->row, &b->proc, "failed: --restore refused");
        }
        b->proc.started_pid = 0;
        b->row = -1;
    }
}

/* --resume, in place of phases 1 and 2: the bank restored (kb-server --restore) from the snapshot of the
 * newest checkpoint that has a complete one which every shard accepts (each checks the snapshot's files), and
 * the checkpoint directory rolled back to that checkpoint, so the makers and the trainer start from it. The
 * graph, pseudo-labels and neighbour embeddings (twotower: the rows it trains) are in the snapshot: no initial
 * graph. Returns 0, or -1 after saying what was wrong with each checkpoint. */
static int s_resume_bank(s_run_t *r)
{
    const int64_t t0 = carls_monotonic_ms();
    const char *dirs[S_MAX_SHARDS];
    for (int i = 0; i < r->n_shards; i++) {
        dirs[i] = r->shard[i].dir;
    }
    carls_resume_candidates_t *cand = carls_xcalloc(1, sizeof *cand);
    char *refused = carls_xcalloc(1, 8192);
    const bool need_snapshot = r->graph_needed || r->tt; /* twotower: the rows it trains are in the bank */
    const int n = carls_resume_candidates(r->ckpt, need_snapshot, dirs, r->n_shards, cand);
    int rc = -1;
    for (int k = 0; k < n && rc != 0 && !s_interrupted; k++) {
        const carls_resume_pair_t *p = &cand->pair[k];
        rc = s_start_bank(r, need_snapshot ? p->snapshot : NULL);
        if (rc == 0) {
            r->resumed = *p;
        } else {
            s_stop_bank(r, p->snapshot, refused, 8192);
        }
    }
    char err[1024];
    if (rc == 0 && carls_resume_rollback(r->ckpt, r->resumed.step, err, sizeof err) != 0) {
        LOG_ERROR("--resume: %s", err);
        rc = -1;
    }
    if (rc != 0) {
        fprintf(stderr, "carls: --resume %s: no checkpoint with a usable bank snapshot to resume from:\n%s%s",
                r->dir, cand->why, refused);
    } else {
        if (*cand->why || *refused) {
            printf("[carls] --resume passed over newer checkpoints:\n%s%s", cand->why, refused);
            s_event(r, "--resume passed over newer checkpoints (see the launcher's log)");
        }
        const char *snap = *r->resumed.snapshot ? r->resumed.snapshot : "none: the run does not use the bank";
        printf("[carls] resumed from step %llu (checkpoint %s, snapshot %s)\n", r->resumed.step, r->resumed.path,
               snap);
        fflush(stdout);
        s_event(r, "resumed from step %llu (checkpoint `%s`, snapshot `%s`)", r->resumed.step, r->resumed.path,
                snap);
    }
    char bank[96];
    carls_stages_add(&r->stages, "bank_restore", (double)(carls_monotonic_ms() - t0) / 1000.0,
                     "bank: %s, %s%s (--resume)", s_bank_words(r, bank, sizeof bank),
                     rc == 0 ? "restored from snapshot " : "no snapshot restored", rc == 0 ? r->resumed.snapshot : "");
    free(refused);
    free(cand);
    return rc;
}

/* 2. The initial graph over pixels, and with a label maker a first label-spreading pass. Returns 0 or -1. */
static int s_initial_graph(s_run_t *r)
{
    const s_cfg_t *c = r->c;
    double s = 0;
    const int n = (int)c->makers;
    const char *px[] = {"--encoder", "pixels", "--pixel-features", c->pixel_features, NULL};
    int rc = s_fleet_once(r, "pixels", "embed", n, px, &s);
    carls_stages_add(&r->stages, "pixel_embeddings", s,
                     "initial makers: pixel embeddings (%s features, %d maker%s)%s", c->pixel_features, n,
                     n == 1 ? "" : "s", rc ? " (failed)" : "");
    if (rc != 0) {
        return -1;
    }
    char kbuf[32];
    s_fmt(kbuf, sizeof kbuf, "%d", (int)c->graph_k);
    const char *gr[] = {"--source", "pixels", "--k", kbuf, NULL};
    rc = s_fleet_once(r, "graph", "graph", n, gr, &s);
    carls_stages_add(&r->stages, "initial_graph", s, "initial graph: k=%d neighbours by graph makers (%d)%s",
                     (int)c->graph_k, n, rc ? " (failed)" : "");
    if (rc != 0) {
        return -1;
    }
    if (r->label_first) {
        char lpc[32], lseed[32], sa_[32], si[32], bal[32];
        s_fmt(lpc, sizeof lpc, "%d", (int)c->labels_per_class);
        s_fmt(lseed, sizeof lseed, "%d", (int)c->label_seed);
        s_fmt(sa_, sizeof sa_, "%g", c->spread_alpha);
        s_fmt(si, sizeof si, "%d", (int)c->spread_iters);
        s_fmt(bal, sizeof bal, "%d", (int)c->label_balance);
        const char *lb[] = {"--labels-per-class", lpc, "--label-seed", lseed, "--k", kbuf, "--spread-alpha", sa_,
                            "--spread-iters", si, "--balance", bal, NULL};
        rc = s_fleet_once(r, "labels0", "label", 1, lb, &s);
        carls_stages_add(&r->stages, "label_spreading", s, "label maker: first label spreading over the graph%s",
                         rc ? " (failed)" : "");
        if (rc != 0) {
            return -1;
        }
    }
    return 0;
}

/* Starts resident maker `task` i/n ("maker TASK I/N", logging to logs/maker-TASK-I.log) with argv a. */
static int s_fleet_start_worker(s_run_t *r, const char *task, int i, int n, const s_argv_t *a)
{
    char name[64], stem[64], log[4400];
    s_fmt(name, sizeof name, "maker %s %d/%d", task, i, n);
    s_resident_stem(stem, sizeof stem, task, i);
    s_fmt(log, sizeof log, "%s/%s.log", r->logs, stem);
    return s_fleet_start(r, name, a, log);
}

/* The word-tower maker i/n (experiment = twotower). */
static int s_start_words_maker(s_run_t *r, int i, int n)
{
    const s_cfg_t *c = r->c;
    s_argv_t a = {0};
    char stem[64];
    s_resident_stem(stem, sizeof stem, "words", i);
    s_arg(&a, "%s/kb-maker", c->bin);
    s_bank_client_args(&a, r, stem);
    const char *const fixed[] = {"--task", "words", "--tables", c->tables, "--ckpt-dir", r->ckpt, NULL};
    s_arg_list(&a, fixed);
    s_arg(&a, "--worker");
    s_arg(&a, "%d/%d", i, n);
    s_maker_timeout_arg(&a, c);
    s_metrics_arg(&a, c, S_METRICS_MAKERS + 2 * (int)c->makers + i);
    s_arg_if_set(&a, "--data", c->data);
    s_arg_if_set(&a, "--gcide-index", c->gcide_index);
    s_arg_if_set(&a, "--gcide-dict", c->gcide_dict);
    return s_fleet_start_worker(r, "words", i, n, &a);
}

/* The resident label maker (graph + model predictions). */
static int s_start_label_maker(s_run_t *r)
{
    const s_cfg_t *c = r->c;
    s_argv_t a = {0};
    char stem[64];
    s_resident_stem(stem, sizeof stem, "label", 0);
    s_maker_args(&a, r, stem, "label", 0, 1);
    s_metrics_arg(&a, c, S_METRICS_MAKERS + 3 * (int)c->makers);
    s_arg(&a, "--ckpt-dir");
    s_arg(&a, "%s", r->ckpt);
    const s_num_arg_t nums[] = {
        {"--labels-per-class", c->labels_per_class, 1}, {"--label-seed", c->label_seed, 1},
        /* graph_refresh 2: rows of 2k, the learned embeddings' k then the pixels' k */
        {"--k", c->graph_refresh == 2 ? 2 * c->graph_k : c->graph_k, 1}, {"--spread-alpha", c->spread_alpha, 0},
        {"--spread-iters", c->spread_iters, 1},         {"--balance", c->label_balance, 1},
        {"--model-weight", c->label_model_weight, 0},
    };
    s_num_args(&a, nums, sizeof nums / sizeof nums[0]);
    if (r->graph_refresh) {
        s_arg(&a, "--wait-graph");
    }
    return s_fleet_start_worker(r, "label", 0, 1, &a);
}

/* 3. The maker fleet on the checkpoint directory: embed makers, graph makers (graph_refresh), word-tower
 * makers (twotower), a label maker. Returns 0 or -1. */
static int s_start_fleet(s_run_t *r)
{
    const s_cfg_t *c = r->c;
    const int n = (int)c->makers;
    char stem[64];
    for (int i = 0; r->embed_fleet && i < n; i++) {
        s_argv_t a = {0};
        s_resident_stem(stem, sizeof stem, "embed", i);
        s_maker_args(&a, r, stem, "embed", i, n);
        s_metrics_arg(&a, c, S_METRICS_MAKERS + i);
        s_arg(&a, "--ckpt-dir");
        s_arg(&a, "%s", r->ckpt);
        if (s_fleet_start_worker(r, "embed", i, n, &a) != 0) {
            return -1;
        }
    }
    for (int i = 0; r->graph_refresh && i < n; i++) {
        s_argv_t a = {0};
        s_resident_stem(stem, sizeof stem, "graph", i);
        s_maker_args(&a, r, stem, "graph", i, n);
        s_metrics_arg(&a, c, S_METRICS_MAKERS + n + i);
        char k[32];
        s_fmt(k, sizeof k, "%d", (int)c->graph_k);
        s_arg_list(&a, (const char *const[]){"--source", c->graph_refresh == 2 ? "emb+pixels" : "emb", "--k", k,
                                             "--ckpt-dir", r->ckpt, NULL});
        if (s_fleet_start_worker(r, "graph", i, n, &a) != 0) {
            return -1;
        }
    }
    for (int i = 0; r->tt && i < n; i++) {
        if (s_start_words_maker(r, i, n) != 0) {
            return -1;
        }
    }
    if (r->label_loop && s_start_label_maker(r) != 0) {
        return -1;
    }
    if (r->n_fleet) {
        printf("[carls] maker fleet: %d process%s watching %s\n", r->n_fleet, r->n_fleet == 1 ? "" : "es", r->ckpt);
    }
    return 0;
}

/* 4. The trainer: started, then followed (its evaluation lines at once, the makers' lines at most every 10 s)
 * while the bank and the makers are supervised, until it exits, the bank is lost, timeout_s passes or we are
 * interrupted. Returns 0, or -1 when it could not be started. */
static int s_run_trainer(s_run_t *r)
{
    const s_cfg_t *c = r->c;
    s_argv_t a = {0};
    s_arg(&a, "%s/trainer", c->bin);
    s_metrics_arg(&a, c, S_METRICS_TRAINER);
    if (r->tt) {
        char vectors[4400];
        s_fmt(vectors, sizeof vectors, "%s/vectors.bin", r->dir);
        s_twotower_args(&a, r, vectors);
    } else {
        s_graphreg_args(&a, r);
    }
    char log[4400];
    s_fmt(log, sizeof log, "%s/trainer.log", r->logs);
    if (carls_proc_start(&r->trainer, "trainer", a.ptr, r->out, log) != 0) {
        return -1;
    }
    r->trainer_row = carls_ptab_started(&r->ptab, "trainer", &r->trainer, NULL);
    s_tail_t tails[CARLS_PROC_MAX + 1];
    int n_tails = 0;
    s_fmt(tails[n_tails].path, sizeof tails[0].path, "%s", log);
    s_fmt(tails[n_tails].tag, sizeof tails[0].tag, "trainer");
    tails[n_tails++].offset = 0;
    for (int i = 0; i < r->n_fleet; i++) {
        s_fmt(tails[n_tails].path, sizeof tails[0].path, "%s", r->fleet_log[i]);
        s_fmt(tails[n_tails].tag, sizeof tails[0].tag, "%s", r->fleet[i].name);
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
        if (s_supervise(r) != 0) {
            break;
        }
        if (s_interrupted || carls_monotonic_ms() > deadline) {
            if (!s_interrupted) {
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

/* 5. Stops everything: the trainer, the makers (SIGTERM to all, then each waited for), then the bank's
 * shards (likewise). */
static void s_stop_all(s_run_t *r)
{
    if (r->trainer.running) {
        carls_proc_stop(&r->trainer, 10000);
        carls_ptab_ended(&r->ptab, r->trainer_row, &r->trainer, "stopped by the launcher");
    }
    for (int i = 0; i < r->n_fleet; i++) {
        if (r->fleet[i].running && carls_proc_poll(&r->fleet[i])) {
            char how[96];
            r->maker_deaths++;
            LOG_WARN("%s %s while the run was ending", r->fleet[i].name,
                     carls_proc_describe(&r->fleet[i], how, sizeof how));
            s_event(r, "%s (pid %d) %s while the run was ending", r->fleet[i].name, (int)r->fleet[i].started_pid, how);
            carls_ptab_ended(&r->ptab, r->fleet_row[i], &r->fleet[i], "died: the run was ending");
        }
    }
    for (int i = 0; i < r->n_fleet; i++) {
        if (r->fleet[i].running) {
            kill(r->fleet[i].pid, SIGTERM);
        }
    }
    for (int i = 0; i < r->n_fleet; i++) {
        if (!r->fleet[i].running) {
            continue;
        }
        int st = carls_proc_stop(&r->fleet[i], 15000);
        carls_ptab_ended(&r->ptab, r->fleet_row[i], &r->fleet[i], "stopped by the launcher");
        if (st != 0) {
            LOG_WARN("%s ended with status %d", r->fleet[i].name, st);
        }
    }
    for (int i = 0; i < r->n_shards; i++) {
        s_shard_t *b = &r->shard[i];
        if (b->proc.running && carls_proc_poll(&b->proc)) {
            char how[96];
            LOG_WARN("%s %s before the launcher stopped it", b->what, carls_proc_describe(&b->proc, how, sizeof how));
            carls_ptab_ended(&r->ptab, b->row, &b->proc, "died: the run was ending");
        } else if (b->proc.running) {
            kill(b->proc.pid, SIGTERM); /* every shard checkpoints at once */
        }
    }
    for (int i = 0; i < r->n_shards; i++) {
        s_shard_t *b = &r->shard[i];
        if (b->proc.running) {
            int server_status = carls_proc_stop(&b->proc, 30000);
            carls_ptab_ended(&r->ptab, b->row, &b->proc, "stopped by the launcher");
            if (server_status != 0) {
                LOG_WARN("%s ended with status %d", b->what, server_status);
            }
        }
    }
}

/* The trainer's stages (wall seconds from its start until the launcher stopped waiting for it): split into
 * start-up, training and evaluation by what it reported when it finished (carls_stages_trainer); one stage
 * when it failed or was stopped. */
static void s_trainer_stages(s_run_t *r, double wall)
{
    if (r->trainer.running || r->trainer.status != 0) {
        carls_stages_add(&r->stages, "trainer", wall, "trainer (makers beside it): %s",
                         r->trainer.running ? "stopped by the launcher" : "failed");
        return;
    }
    carls_result_t *res = carls_xmalloc(sizeof *res);
    carls_result_read(res, r->out);
    char log[4400];
    s_fmt(log, sizeof log, "%s/trainer.log", r->logs);
    carls_stages_trainer(&r->stages, wall, r->c->experiment, res, r->metrics, log);
    free(res);
}

/* Prints the graphreg run's result line (accuracy first); returns the launcher's status. */
static int s_graphreg_result(const s_run_t *r, const carls_result_t *res, int plotted, double wall)
{
    const char *acc = carls_result_get(res, "test_accuracy") ? "test_accuracy" : "val_accuracy";
    const double *v = carls_result_get(res, acc);
    if (!v) {
        LOG_ERROR("the trainer printed no %s (see %s)", acc, r->out);
        return 1;
    }
    printf("[carls] report: %s/report.md, metrics: %s%s, processes: %s\n", r->dir, r->metrics,
           plotted ? ", plots: accuracy.png staleness.png" : "", r->ptab_path);
    const char *show[] = {"steps_per_s", "wait_ms_per_step", "neighbors_used", "neighbors_stale",
                          "neighbors_missing", "bank_fetches_skipped", NULL};
    printf("%s=%.4f ", acc, *v);
    s_print_result_line(r, res, show, wall);
    return 0;
}

/* The trainer finished: plots, report.md (stages, faults) and the result line. Returns the launcher's status. */
static int s_report(s_run_t *r, double wall)
{
    const s_cfg_t *c = r->c;
    carls_result_t res;
    carls_result_read(&res, r->out);
    const int64_t t0 = carls_monotonic_ms();
    char knowledge[4400]; /* the knowledge per refresh from the makers' logs, for the report and its plots */
    s_fmt(knowledge, sizeof knowledge, "%s/" CARLS_KNOWLEDGE_CSV, r->dir);
    carls_knowledge_write(r->logs, knowledge);
    int plotted = carls_report_plots(r->dir, r->metrics, c->experiment) == 0;
    carls_stages_add(&r->stages, "report", (double)(carls_monotonic_ms() - t0) / 1000.0,
                     "report: knowledge per refresh%s", plotted ? " and plots (gnuplot)" : "");
    r->total_s = s_elapsed(r);
    char *stages = carls_xmalloc(8192);
    carls_stages_table(&r->stages, r->total_s, stages, 8192);
    const double *skipped = carls_result_get(&res, "bank_fetches_skipped");
    char faults[10240];
    snprintf(faults, sizeof faults,
             "kb-server restarts: %d (max_bank_restarts = %d per shard), maker deaths: %d, maker restarts: %d "
             "(max_maker_restarts = %d), trainer batches without the bank: %.0f. Every process: "
             "`processes.tsv`.\n\n%s%s",
             r->bank_restarts, (int)c->max_bank_restarts, r->maker_deaths, r->maker_restarts,
             (int)c->max_maker_restarts, skipped ? *skipped : 0.0,
             r->elen ? "| at (s) | what happened |\n| --- | --- |\n" : "No process died.\n", r->events);
    carls_report_write(r->dir, r->config, r->ini, &res, stages, faults, plotted);
    free(stages);
    return r->tt ? s_twotower_result(r, &res, plotted, wall) : s_graphreg_result(r, &res, plotted, wall);
}

/* Phases 1-4, then 5 whatever happened; returns the launcher's status. */
static int s_run(s_run_t *r)
{
    const s_cfg_t *c = r->c;
    r->tt = strcmp(c->experiment, "twotower") == 0;
    r->graph_needed = !r->tt && (c->alpha > 0 || c->beta > 0);
    r->bank_emb = !r->tt && c->alpha > 0 && strcmp(c->neighbors_from, "bank") == 0;
    /* A refreshed graph needs the embed fleet whether or not the trainer reads neighbour embeddings (alpha 0),
     * and a resident label maker that spreads again over each refreshed graph. */
    r->graph_refresh = r->graph_needed && c->graph_refresh > 0;
    r->embed_fleet = r->bank_emb || r->graph_refresh;
    r->label_loop = !r->tt && c->beta > 0 && c->label_maker > 0 && (c->label_model_weight > 0 || r->graph_refresh);
    r->label_first = r->graph_needed && c->beta > 0 && c->label_maker > 0;
    r->t0 = carls_monotonic_ms();
    for (int i = 0; i < r->n_shards; i++) {
        r->shard[i].row = -1;
    }
    r->trainer_row = -1;
    r->fleet_argv = carls_xcalloc(CARLS_PROC_MAX, sizeof *r->fleet_argv);
    carls_ptab_init(&r->ptab, r->ptab_path);
    s_print_plan(r);
    if (*r->note) {
        s_event(r, "%s", r->note);
    }
    s_write_metrics_targets(c, r->dir, r->tt, r->embed_fleet, r->graph_refresh, r->label_loop);
    bool ready = !r->curve || s_make_keys(r) == 0;
    if (ready && r->resume_dir) {
        ready = s_resume_bank(r) == 0; /* the graph and pseudo-labels come back with the snapshot */
    } else if (ready) {
        const int64_t t_bank = carls_monotonic_ms();
        ready = s_start_bank(r, NULL) == 0;
        char bank[96];
        carls_stages_add(&r->stages, "bank_startup", (double)(carls_monotonic_ms() - t_bank) / 1000.0,
                         "bank: %s%s", s_bank_words(r, bank, sizeof bank), ready ? "" : " (failed)");
        ready = ready && (!r->graph_needed || s_initial_graph(r) == 0);
    }
    int64_t t = carls_monotonic_ms();
    if (ready && s_start_fleet(r) == 0) {
        carls_stages_add(&r->stages, "makers_start", (double)(carls_monotonic_ms() - t) / 1000.0,
                         "resident makers started (%d process%s)", r->n_fleet, r->n_fleet == 1 ? "" : "es");
        t = carls_monotonic_ms();
        if (s_run_trainer(r) == 0) {
            s_trainer_stages(r, (double)(carls_monotonic_ms() - t) / 1000.0);
        }
    }
    t = carls_monotonic_ms();
    s_stop_all(r);
    carls_stages_add(&r->stages, "shutdown", (double)(carls_monotonic_ms() - t) / 1000.0,
                     "shutdown: trainer, makers and bank stopped");
    const double wall = (double)(carls_monotonic_ms() - r->t0) / 1000.0;
    int status = 1;
    if (s_interrupted) {
        printf("[carls] interrupted: every process stopped (%.1f s)\n", wall);
        status = 130;
    } else if (r->bank_lost) {
        LOG_ERROR("the run failed: a kb-server died more than max_bank_restarts = %d times (%d restart%s in all); "
                  "see %s/processes.tsv",
                  (int)c->max_bank_restarts, r->bank_restarts, r->bank_restarts == 1 ? "" : "s", r->dir);
    } else if (!r->trainer.pid && r->trainer.status == 0 && r->trainer.name[0]) {
        status = s_report(r, wall);
    } else if (r->trainer.name[0]) {
        LOG_ERROR("trainer failed with status %d (see %s/trainer.log)", r->trainer.status, r->logs);
    }
    /* Every run, finished or not, leaves its stage times (report.md has them only when it finished). */
    char path[4400], err[1024];
    s_fmt(path, sizeof path, "%s/" CARLS_STAGES_JSON, r->dir);
    if (carls_stages_write_json(path, &r->stages, r->total_s > 0 ? r->total_s : s_elapsed(r), c->name,
                                c->experiment, status, err, sizeof err) != 0) {
        LOG_WARN("cannot write the stage times: %s", err);
    }
    fflush(stdout);
    free(r->fleet_argv);
    return status;
}

/* --resume RUN_DIR (argv[1], argv[2]): checks the directory and names its run.ini (settings, settings_len
 * bytes) as the configuration. Returns 0, or 2 after saying what is wrong. */
static int s_resume_args(int argc, char **argv, char *settings, size_t settings_len)
{
    struct stat st;
    if (argc < 3 || !*argv[2]) {
        fprintf(stderr, "carls: --resume needs the run's directory (runs/<name>)\n");
        return 2;
    }
    if (stat(argv[2], &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "carls: --resume %s: %s\n", argv[2], stat(argv[2], &st) != 0 ? strerror(errno) : "not a directory");
        return 2;
    }
    s_fmt(settings, settings_len, "%s/%s", argv[2], CARLS_RESUME_SETTINGS);
    if (access(settings, R_OK) != 0) {
        fprintf(stderr, "carls: --resume %s: no %s in it (%s): not a run directory of carls run, or one made by an "
                        "older build\n", argv[2], CARLS_RESUME_SETTINGS, strerror(errno));
        return 2;
    }
    return 0;
}

/* Whether the run in dir (settings c) stopped before the trainer wrote its first checkpoint: nothing to resume
 * from, so --resume starts it again from the beginning, and says so. A checkpoint directory that cannot be
 * read is not that case (s_resume_bank names the problem). */
static bool s_nothing_to_resume(const char *dir, const s_cfg_t *c)
{
    char ckpt[4400];
    s_fmt(ckpt, sizeof ckpt, "%s/ckpt", dir);
    if (carls_resume_count(ckpt) != 0) {
        return false;
    }
    /* graphreg checkpoints before its first step, twotower after ckpt_every steps. */
    const bool tt = strcmp(c->experiment, "twotower") == 0;
    fprintf(stderr, "carls: %s has no checkpoint yet (the run stopped before the trainer's first one, at step %d): "
            "starting it again from the beginning\n", dir, tt ? (int)c->ckpt_every : 0);
    return true;
}

int carls_run_main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0) {
        printf("usage: carls run CONFIG.ini [--set key=value]... [--quiet]\n"
               "       carls run --resume RUN_DIR [--quiet]\n"
               "  e.g. --set shards=2 (a bank of 2 kb-servers) --set curve=on (CURVE keys for every process);\n"
               "  every key of the file can be set (docs/EXPERIMENTS.md)\n"
               "  --resume RUN_DIR: continue a graphreg or twotower run that was stopped or killed (runs/<name>)\n"
               "  from its newest checkpoint that has a complete bank snapshot: the bank restored from the snapshot,\n"
               "  the trainer from the checkpoint (model, optimiser, data position, RNG), makers restarted; the\n"
               "  settings are RUN_DIR/run.ini (docs/STATE.md \"Resuming a run\"); a run stopped before the trainer's\n"
               "  first checkpoint starts again from the beginning\n"
               "  stage times of every run: report.md's Stages table and RUN_DIR/stages.json\n");
        return argc < 2 ? 2 : 0;
    }
    const char *resume_dir = NULL;
    char settings[4400];
    if (strcmp(argv[1], "--resume") == 0) {
        if (s_resume_args(argc, argv, settings, sizeof settings) != 0) {
            return 2;
        }
        resume_dir = argv[2];
        argv[2] = settings; /* the configuration: RUN_DIR/run.ini, then the other arguments as usual */
        argc--;
        argv++;
    }
    carls_ini_t *ini = carls_xcalloc(1, sizeof *ini);
    s_cfg_t c;
    bool quiet = false;
    char note[1600];
    int status = s_load_config(argc, argv, ini, &c, &quiet, note, sizeof note);
    if (status == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = s_on_signal;
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        s_run_t *r = carls_xcalloc(1, sizeof *r);
        r->c = &c;
        r->config = argv[1];
        r->ini = ini;
        r->quiet = quiet;
        r->resume_dir = resume_dir;
        r->note = note;
        if (resume_dir && s_nothing_to_resume(resume_dir, &c)) {
            r->resume_dir = NULL;
            r->restart_dir = resume_dir;
        }
        status = s_prepare_dir(r) == 0 && carls_slurm_begin(r->dir, c.name) == 0 ? s_run(r) : 1;
        carls_slurm_end();
        free(r);
    }
    free(ini);
    return status;
}
