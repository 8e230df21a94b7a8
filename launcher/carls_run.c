/* The experiment launcher (see carls_run.h). */
#include "carls_run.h"

#include "carls_ini.h"
#include "carls_proc.h"
#include "carls_report.h"

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
    char arg[64][600];
    char *ptr[65];
} s_argv_t;

static void s_arg(s_argv_t *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void s_arg(s_argv_t *a, const char *fmt, ...)
{
    if (a->n >= 64) {
        CARLS_FATAL("launcher: too many arguments");
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->arg[a->n], sizeof a->arg[0], fmt, ap);
    va_end(ap);
    a->ptr[a->n] = a->arg[a->n];
    a->n++;
    a->ptr[a->n] = NULL;
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

static int s_mkdirs(const char *dir)
{
    char tmp[4200];
    s_fmt(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST) {
                return -1;
            }
            *p = '/';
        }
    }
    return mkdir(tmp, 0755) == 0 || errno == EEXIST ? 0 : -1;
}

/* The run's settings, read from the configuration. */
typedef struct {
    const char *name, *runs_dir, *data_dir, *tables, *hidden, *neighbors_from, *maker_device, *trainer_device;
    char bin[4096];
    double items, labels_per_class, label_seed, validation, kb_threads, makers, graph_k, graph_refresh;
    double label_maker, label_model_weight, label_balance, spread_alpha, spread_iters;
    double alpha, beta, conf_threshold, rampup, neighbors, max_staleness, steps, batch_labelled, batch_unlabelled;
    double dropout, lr, ckpt_every, eval_every, seed, timeout_s, shards;
} s_cfg_t;

static int s_cfg(const carls_ini_t *ini, s_cfg_t *c, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    c->name = carls_ini_get(ini, "name", "graphreg");
    c->runs_dir = carls_ini_get(ini, "runs_dir", "runs");
    c->data_dir = carls_ini_get(ini, "data_dir", "");
    c->tables = carls_ini_get(ini, "tables", "fmnist");
    c->hidden = carls_ini_get(ini, "hidden", "256,128");
    c->neighbors_from = carls_ini_get(ini, "neighbors_from", "bank");
    c->maker_device = carls_ini_get(ini, "maker_device", "auto");
    c->trainer_device = carls_ini_get(ini, "trainer_device", "cpu");
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
        {"neighbors", &c->neighbors, 10},
        {"max_staleness", &c->max_staleness, 0},
        {"steps", &c->steps, 3000},
        {"batch_labelled", &c->batch_labelled, 100},
        {"batch_unlabelled", &c->batch_unlabelled, 128},
        {"dropout", &c->dropout, 0.2},
        {"lr", &c->lr, 0.001},
        {"ckpt_every", &c->ckpt_every, 100},
        {"eval_every", &c->eval_every, 500},
        {"seed", &c->seed, 1},
        {"timeout_s", &c->timeout_s, 1200},
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        if (carls_ini_get_double(ini, nums[i].key, nums[i].def, nums[i].out, err, errlen) != 0) {
            return -1;
        }
    }
    if (c->shards != 1) {
        s_fmt(err, errlen, "shards = %g: this build's makers and trainer use the single-endpoint client; "
                 "only shards = 1 is supported until the sharded client lands", c->shards);
        return -1;
    }
    if (c->makers < 1 || c->makers > 64) {
        s_fmt(err, errlen, "makers = %g: need 1..64", c->makers);
        return -1;
    }
    if (strchr(c->name, '/') || !*c->name) {
        s_fmt(err, errlen, "name = '%s': must be a plain non-empty name", c->name);
        return -1;
    }
    return 0;
}

/* Common maker arguments. */
static void s_maker_args(s_argv_t *a, const s_cfg_t *c, const char *endpoint, const char *task, int worker,
                         int workers)
{
    s_arg(a, "%s/kb-maker", c->bin);
    s_arg(a, "--kb");
    s_arg(a, "%s", endpoint);
    s_arg(a, "--task");
    s_arg(a, "%s", task);
    s_arg(a, "--worker");
    s_arg(a, "%d/%d", worker, workers);
    s_arg(a, "--tables");
    s_arg(a, "%s", c->tables);
    s_arg(a, "--items");
    s_arg(a, "%d", (int)c->items);
    s_arg(a, "--device");
    s_arg(a, "%s", c->maker_device);
    if (*c->data_dir) {
        s_arg(a, "--data-dir");
        s_arg(a, "%s", c->data_dir);
    }
}

/* Runs a fleet of `n` one-shot makers to completion. Returns 0, or -1 when one failed or we were stopped. */
static int s_fleet_once(const s_cfg_t *c, const char *endpoint, const char *logs, const char *label,
                        const char *task, int n, const char *const *extra, double *seconds)
{
    carls_proc_t p[CARLS_PROC_MAX];
    int64_t t0 = carls_monotonic_ms();
    int started = 0, rc = 0;
    for (int i = 0; i < n; i++) {
        s_argv_t a = {0};
        s_maker_args(&a, c, endpoint, task, i, n);
        s_arg(&a, "--once");
        for (int e = 0; extra && extra[e]; e++) {
            s_arg(&a, "%s", extra[e]);
        }
        char name[64], log[4300];
        s_fmt(name, sizeof name, "%s %d/%d", label, i, n);
        s_fmt(log, sizeof log, "%s/%s-%d.log", logs, label, i);
        if (carls_proc_start(&p[started], name, a.ptr, log, log) != 0) {
            rc = -1;
            break;
        }
        started++;
    }
    for (int i = 0; i < started; i++) {
        while (!carls_proc_wait(&p[i], 200)) {
            if (s_interrupted) {
                carls_proc_stop(&p[i], 5000);
            }
        }
        if (p[i].status != 0) {
            LOG_ERROR("%s exited with status %d (see %s/%s-%d.log)", p[i].name, p[i].status, logs, label, i);
            rc = -1;
        }
    }
    *seconds = (double)(carls_monotonic_ms() - t0) / 1000.0;
    printf("[carls] %s: %d maker%s in %.1f s%s\n", label, n, n == 1 ? "" : "s", *seconds, rc ? " (FAILED)" : "");
    fflush(stdout);
    return s_interrupted ? -1 : rc;
}

int carls_run_main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0) {
        printf("usage: carls run CONFIG.ini [--set key=value]... [--quiet]\n");
        return argc < 2 ? 2 : 0;
    }
    const char *config = argv[1];
    char err[2048];
    carls_ini_t *ini = carls_xcalloc(1, sizeof *ini);
    bool quiet = false;
    int status = 2;
    carls_proc_t server = {0}, fleet[CARLS_PROC_MAX], trainer = {0};
    static char fleet_log[CARLS_PROC_MAX][4400];
    int n_fleet = 0;
    if (carls_ini_load(ini, config, err, sizeof err) != 0) {
        fprintf(stderr, "carls: %s\n", err);
        free(ini);
        return 2;
    }
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--set") == 0 && i + 1 < argc) {
            if (carls_ini_set(ini, argv[++i], err, sizeof err) != 0) {
                fprintf(stderr, "carls: %s\n", err);
                free(ini);
                return 2;
            }
        } else if (strncmp(argv[i], "--set=", 6) == 0) {
            if (carls_ini_set(ini, argv[i] + 6, err, sizeof err) != 0) {
                fprintf(stderr, "carls: %s\n", err);
                free(ini);
                return 2;
            }
        } else if (strcmp(argv[i], "--quiet") == 0) {
            quiet = true;
        } else {
            fprintf(stderr, "carls: unexpected argument '%s'\n", argv[i]);
            free(ini);
            return 2;
        }
    }
    s_cfg_t c;
    if (s_cfg(ini, &c, err, sizeof err) != 0) {
        fprintf(stderr, "carls: %s: %s\n", config, err);
        free(ini);
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    char dir[4200], logs[4300], kbdir[4300], ckpt[4300], epfile[4300], metrics[4300], out[4300];
    s_fmt(dir, sizeof dir, "%s/%s", c.runs_dir, c.name);
    s_fmt(logs, sizeof logs, "%s/logs", dir);
    s_fmt(kbdir, sizeof kbdir, "%s/kb", dir);
    s_fmt(ckpt, sizeof ckpt, "%s/ckpt", dir);
    s_fmt(epfile, sizeof epfile, "%s/kb.endpoint", dir);
    s_fmt(metrics, sizeof metrics, "%s/metrics.csv", dir);
    s_fmt(out, sizeof out, "%s/trainer.out", dir);
    /* A fresh run directory: the bank, checkpoints and logs of an earlier run with this name go. */
    char cmd[9000];
    s_fmt(cmd, sizeof cmd, "rm -rf '%s' '%s' '%s' '%s' '%s' '%s'", kbdir, ckpt, logs, epfile, metrics, out);
    if (system(cmd) != 0 || s_mkdirs(logs) != 0) {
        fprintf(stderr, "carls: cannot prepare %s\n", dir);
        free(ini);
        return 1;
    }
    status = 1;
    const int64_t t_run = carls_monotonic_ms();
    char phases[4096] = "";
    size_t plen = 0;
    const bool graph_needed = c.alpha > 0 || c.beta > 0;
    const bool bank_emb = c.alpha > 0 && strcmp(c.neighbors_from, "bank") == 0;
    const bool label_loop = c.beta > 0 && c.label_maker > 0 && c.label_model_weight > 0;
    printf("[carls] run %s: %s, label seed %g, %s%s, results in %s\n", c.name, config, c.label_seed,
           graph_needed ? "graph from the bank" : "supervised only (alpha = beta = 0)",
           bank_emb ? ", neighbour embeddings from the maker fleet" : "", dir);
    fflush(stdout);

    /* 1. The bank. */
    char endpoint[512] = "";
    {
        s_argv_t a = {0};
        s_arg(&a, "%s/kb-server", c.bin);
        s_arg(&a, "--listen");
        s_arg(&a, "tcp://127.0.0.1:*");
        s_arg(&a, "--endpoint-file");
        s_arg(&a, "%s", epfile);
        s_arg(&a, "--data");
        s_arg(&a, "%s", kbdir);
        s_arg(&a, "--durability");
        s_arg(&a, "interval:1000");
        s_arg(&a, "--threads");
        s_arg(&a, "%d", (int)c.kb_threads);
        char log[4400];
        s_fmt(log, sizeof log, "%s/kb-server-0.log", logs);
        if (carls_proc_start(&server, "kb-server 0/1", a.ptr, log, log) != 0) {
            goto stop;
        }
        for (int i = 0; i < 600 && !s_interrupted; i++) {
            FILE *f = fopen(epfile, "r");
            if (f) {
                if (fgets(endpoint, sizeof endpoint, f)) {
                    endpoint[strcspn(endpoint, "\r\n")] = '\0';
                }
                fclose(f);
            }
            if (*endpoint || carls_proc_poll(&server)) {
                break;
            }
            usleep(50 * 1000);
        }
        if (!*endpoint) {
            LOG_ERROR("kb-server did not start (see %s)", log);
            goto stop;
        }
        printf("[carls] kb-server listening on %s\n", endpoint);
    }
    /* 2. The initial graph over pixels (and a first label pass). */
    if (graph_needed) {
        double s = 0;
        const int n = (int)c.makers;
        const char *px[] = {"--encoder", "pixels", NULL};
        if (s_fleet_once(&c, endpoint, logs, "pixels", "embed", n, px, &s) != 0) {
            goto stop;
        }
        plen += (size_t)snprintf(phases + plen, sizeof phases - plen, "| pixel embeddings (%d makers) | %.1f |\n", n, s);
        char kbuf[32];
        s_fmt(kbuf, sizeof kbuf, "%d", (int)c.graph_k);
        const char *gr[] = {"--source", "pixels", "--k", kbuf, NULL};
        if (s_fleet_once(&c, endpoint, logs, "graph", "graph", n, gr, &s) != 0) {
            goto stop;
        }
        plen += (size_t)snprintf(phases + plen, sizeof phases - plen, "| initial k=%d graph (%d makers) | %.1f |\n",
                                 (int)c.graph_k, n, s);
        if (c.beta > 0 && c.label_maker > 0) {
            char lpc[32], lseed[32], sa_[32], si[32], bal[32];
            s_fmt(lpc, sizeof lpc, "%d", (int)c.labels_per_class);
            s_fmt(lseed, sizeof lseed, "%d", (int)c.label_seed);
            s_fmt(sa_, sizeof sa_, "%g", c.spread_alpha);
            s_fmt(si, sizeof si, "%d", (int)c.spread_iters);
            s_fmt(bal, sizeof bal, "%d", (int)c.label_balance);
            const char *lb[] = {"--labels-per-class", lpc, "--label-seed", lseed, "--k", kbuf, "--spread-alpha", sa_,
                                "--spread-iters", si, "--balance", bal, NULL};
            if (s_fleet_once(&c, endpoint, logs, "labels0", "label", 1, lb, &s) != 0) {
                goto stop;
            }
            plen += (size_t)snprintf(phases + plen, sizeof phases - plen, "| first label spreading | %.1f |\n", s);
        }
    }
    /* 3. The maker fleet on the checkpoint directory. */
    {
        const int n = (int)c.makers;
        for (int i = 0; bank_emb && i < n; i++) {
            s_argv_t a = {0};
            s_maker_args(&a, &c, endpoint, "embed", i, n);
            s_arg(&a, "--ckpt-dir");
            s_arg(&a, "%s", ckpt);
            char name[64], log[4400];
            s_fmt(name, sizeof name, "maker embed %d/%d", i, n);
            s_fmt(log, sizeof log, "%s/maker-embed-%d.log", logs, i);
            if (carls_proc_start(&fleet[n_fleet], name, a.ptr, log, log) != 0) {
                goto stop;
            }
            s_fmt(fleet_log[n_fleet], sizeof fleet_log[0], "%s", log);
            n_fleet++;
        }
        for (int i = 0; c.graph_refresh > 0 && bank_emb && i < n; i++) {
            s_argv_t a = {0};
            s_maker_args(&a, &c, endpoint, "graph", i, n);
            s_arg(&a, "--source");
            s_arg(&a, "emb");
            s_arg(&a, "--k");
            s_arg(&a, "%d", (int)c.graph_k);
            s_arg(&a, "--ckpt-dir");
            s_arg(&a, "%s", ckpt);
            char name[64], log[4400];
            s_fmt(name, sizeof name, "maker graph %d/%d", i, n);
            s_fmt(log, sizeof log, "%s/maker-graph-%d.log", logs, i);
            if (carls_proc_start(&fleet[n_fleet], name, a.ptr, log, log) != 0) {
                goto stop;
            }
            s_fmt(fleet_log[n_fleet], sizeof fleet_log[0], "%s", log);
            n_fleet++;
        }
        if (label_loop) {
            s_argv_t a = {0};
            s_maker_args(&a, &c, endpoint, "label", 0, 1);
            s_arg(&a, "--ckpt-dir");
            s_arg(&a, "%s", ckpt);
            s_arg(&a, "--labels-per-class");
            s_arg(&a, "%d", (int)c.labels_per_class);
            s_arg(&a, "--label-seed");
            s_arg(&a, "%d", (int)c.label_seed);
            s_arg(&a, "--k");
            s_arg(&a, "%d", (int)c.graph_k);
            s_arg(&a, "--spread-alpha");
            s_arg(&a, "%g", c.spread_alpha);
            s_arg(&a, "--spread-iters");
            s_arg(&a, "%d", (int)c.spread_iters);
            s_arg(&a, "--balance");
            s_arg(&a, "%d", (int)c.label_balance);
            s_arg(&a, "--model-weight");
            s_arg(&a, "%g", c.label_model_weight);
            char log[4400];
            s_fmt(log, sizeof log, "%s/maker-label-0.log", logs);
            if (carls_proc_start(&fleet[n_fleet], "maker label 0/1", a.ptr, log, log) != 0) {
                goto stop;
            }
            s_fmt(fleet_log[n_fleet], sizeof fleet_log[0], "%s", log);
            n_fleet++;
        }
        if (n_fleet) {
            printf("[carls] maker fleet: %d process%s watching %s\n", n_fleet, n_fleet == 1 ? "" : "es", ckpt);
        }
    }
    /* 4. The trainer. */
    const int64_t t_train = carls_monotonic_ms();
    {
        s_argv_t a = {0};
        s_arg(&a, "%s/trainer", c.bin);
        s_arg(&a, "graphreg");
        s_arg(&a, "--data");
        s_arg(&a, "fashion-mnist");
        if (*c.data_dir) {
            s_arg(&a, "--data-dir");
            s_arg(&a, "%s", c.data_dir);
        }
        if (graph_needed) {
            s_arg(&a, "--kb");
            s_arg(&a, "%s", endpoint);
        }
        const struct {
            const char *flag;
            double v;
            int is_int;
        } nums[] = {
            {"--labels-per-class", c.labels_per_class, 1}, {"--label-seed", c.label_seed, 1},
            {"--train-items", c.items, 1},                 {"--validation", c.validation, 1},
            {"--steps", c.steps, 1},                       {"--batch-labelled", c.batch_labelled, 1},
            {"--batch-unlabelled", c.batch_unlabelled, 1}, {"--dropout", c.dropout, 0},
            {"--lr", c.lr, 0},                             {"--seed", c.seed, 1},
            {"--alpha", c.alpha, 0},                       {"--beta", c.beta, 0},
            {"--conf-threshold", c.conf_threshold, 0},     {"--rampup", c.rampup, 1},
            {"--neighbors", c.neighbors, 1},               {"--max-staleness", c.max_staleness, 1},
            {"--ckpt-every", c.ckpt_every, 1},             {"--eval-every", c.eval_every, 1},
        };
        for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
            s_arg(&a, "%s", nums[i].flag);
            if (nums[i].is_int) {
                s_arg(&a, "%d", (int)nums[i].v);
            } else {
                s_arg(&a, "%g", nums[i].v);
            }
        }
        s_arg(&a, "--hidden");
        s_arg(&a, "%s", c.hidden);
        s_arg(&a, "--neighbors-from");
        s_arg(&a, "%s", c.neighbors_from);
        s_arg(&a, "--tables");
        s_arg(&a, "%s", c.tables);
        s_arg(&a, "--ckpt-dir");
        s_arg(&a, "%s", ckpt);
        s_arg(&a, "--metrics");
        s_arg(&a, "%s", metrics);
        s_arg(&a, "--device");
        s_arg(&a, "%s", c.trainer_device);
        char log[4400];
        s_fmt(log, sizeof log, "%s/trainer.log", logs);
        if (carls_proc_start(&trainer, "trainer", a.ptr, out, log) != 0) {
            goto stop;
        }
        s_tail_t tails[CARLS_PROC_MAX + 1];
        int n_tails = 0;
        s_fmt(tails[n_tails].path, sizeof tails[0].path, "%s", log);
        s_fmt(tails[n_tails].tag, sizeof tails[0].tag, "trainer");
        tails[n_tails++].offset = 0;
        for (int i = 0; i < n_fleet; i++) {
            s_fmt(tails[n_tails].path, sizeof tails[0].path, "%s", fleet_log[i]);
            s_fmt(tails[n_tails].tag, sizeof tails[0].tag, "%s", fleet[i].name);
            tails[n_tails++].offset = 0;
        }
        const char *const trainer_needles[] = {"step ", "ERROR", "WARN", NULL};
        const char *const maker_needles[] = {"embed step", "label step", "graph from", "ERROR", "WARN", NULL};
        const int64_t deadline = carls_monotonic_ms() + (int64_t)(c.timeout_s * 1000.0);
        int64_t last_maker_print = 0;
        while (!carls_proc_wait(&trainer, 500)) {
            s_tail(&tails[0], trainer_needles, quiet);
            /* Makers: at most one batch of their lines every 10 s, so the trainer's lines stay readable. */
            if (carls_monotonic_ms() - last_maker_print > 10000) {
                for (int i = 1; i < n_tails; i++) {
                    s_tail(&tails[i], maker_needles, quiet);
                }
                last_maker_print = carls_monotonic_ms();
            }
            for (int i = 0; i < n_fleet; i++) {
                if (fleet[i].running && carls_proc_poll(&fleet[i])) {
                    LOG_ERROR("%s exited early with status %d", fleet[i].name, fleet[i].status);
                }
            }
            if (s_interrupted || carls_monotonic_ms() > deadline) {
                if (!s_interrupted) {
                    LOG_ERROR("the run took more than timeout_s = %g s: stopping it", c.timeout_s);
                }
                break;
            }
        }
        s_tail(&tails[0], trainer_needles, quiet);
        for (int i = 1; i < n_tails; i++) {
            s_tail(&tails[i], maker_needles, quiet);
        }
    }
    plen += (size_t)snprintf(phases + plen, sizeof phases - plen, "| trainer (makers running beside it) | %.1f |\n",
                             (double)(carls_monotonic_ms() - t_train) / 1000.0);

stop:
    /* 5. Stop everything: trainer, makers, then the bank. */
    if (trainer.running) {
        carls_proc_stop(&trainer, 10000);
    }
    for (int i = 0; i < n_fleet; i++) {
        if (fleet[i].running) {
            kill(fleet[i].pid, SIGTERM);
        }
    }
    for (int i = 0; i < n_fleet; i++) {
        int st = carls_proc_stop(&fleet[i], 15000);
        if (st != 0) {
            LOG_WARN("%s ended with status %d", fleet[i].name, st);
        }
    }
    int server_status = server.pid || server.running ? carls_proc_stop(&server, 30000) : 0;
    if (server_status != 0) {
        LOG_WARN("kb-server ended with status %d", server_status);
    }
    const double wall = (double)(carls_monotonic_ms() - t_run) / 1000.0;
    if (s_interrupted) {
        printf("[carls] interrupted: every process stopped (%.1f s)\n", wall);
        status = 130;
        goto done;
    }
    if (!trainer.pid && trainer.status == 0 && trainer.name[0]) {
        carls_result_t r;
        carls_result_read(&r, out);
        plen += (size_t)snprintf(phases + plen, sizeof phases - plen, "| whole run | %.1f |\n", wall);
        int plotted = carls_report_plots(dir, metrics) == 0;
        carls_report_write(dir, config, ini, &r, phases, plotted);
        const char *acc = carls_result_get(&r, "test_accuracy") ? "test_accuracy" : "val_accuracy";
        const double *v = carls_result_get(&r, acc);
        if (!v) {
            LOG_ERROR("the trainer printed no %s (see %s)", acc, out);
            goto done;
        }
        printf("[carls] report: %s/report.md, metrics: %s%s\n", dir, metrics, plotted ? ", plots: accuracy.png staleness.png" : "");
        const char *show[] = {"steps_per_s", "wait_ms_per_step", "neighbors_used", "neighbors_stale",
                              "neighbors_missing", NULL};
        printf("%s=%.4f", acc, *v);
        for (int i = 0; show[i]; i++) {
            const double *x = carls_result_get(&r, show[i]);
            if (x) {
                printf(" %s=%.6g", show[i], *x);
            }
        }
        printf(" wall_s=%.1f\n", wall);
        status = 0;
    } else if (trainer.name[0]) {
        LOG_ERROR("trainer failed with status %d (see %s/trainer.log)", trainer.status, logs);
    }
done:
    fflush(stdout);
    free(ini);
    return status;
}
