/* The experiment launcher (see carls_run.h): the run's phases in order, its directory, keys and report. */
#include "carls_run.h"

#include "carls_fleet.h"
#include "carls_knowledge.h"
#include "carls_report.h"
#include "carls_run_internal.h"
#include "carls_replicas.h"
#include "carls_shards.h"
#include "carls_slurm.h"
#include "carls_train.h"

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

bool carls_run_interrupted(void)
{
    return s_interrupted != 0;
}

double carls_run_elapsed(const carls_run_t *r)
{
    return (double)(carls_monotonic_ms() - r->t0) / 1000.0;
}

/* ---- what each process is given -------------------------------------------------------------------------
 * Every client of the bank (makers, trainer) is named by a stem, which names its log file and, with
 * curve = on, its key: "trainer", "maker-TASK-I" (resident makers), "LABEL-I" (one-shot fleets: pixels-I,
 * graph-I, labels0-0). s_each_client lists the stems of a run; carls_run_bank_client_args gives a process its bank. */

void carls_run_resident_stem(char *stem, size_t len, const char *task, int i)
{
    carls_fmt(stem, len, "maker-%s-%d", task, i);
}

void carls_run_once_stem(char *stem, size_t len, const char *label, int i)
{
    carls_fmt(stem, len, "%s-%d", label, i);
}

/* Calls fn(r, stem) for every client process the run will start, in the order they start; stops at the
 * first that fails. Returns 0, or what fn returned. Phases 2-4 start exactly these (the same flags decide).
 * The trainer is always listed, also when it runs without the bank (graphreg with alpha = beta = 0): a server
 * refuses an empty allow-list. */
static int s_each_client(carls_run_t *r, int (*fn)(carls_run_t *r, const char *stem))
{
    const int n = (int)r->c->makers;
    char stem[64];
    int rc = 0;
    for (int i = 0; r->graph_needed && i < n && rc == 0; i++) {
        carls_run_once_stem(stem, sizeof stem, "pixels", i);
        rc = fn(r, stem);
        carls_run_once_stem(stem, sizeof stem, "graph", i);
        rc = rc ? rc : fn(r, stem);
    }
    if (r->label_first && rc == 0) {
        carls_run_once_stem(stem, sizeof stem, "labels0", 0);
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
            carls_run_resident_stem(stem, sizeof stem, resident[k].task, i);
            rc = fn(r, stem);
        }
    }
    /* A replicated shard's members follow their primary as its clients (kb-server --replica-curve-key): any
     * of them may be a follower in turn. */
    for (int i = 0; r->replicas > 1 && i < r->n_members && rc == 0; i++) {
        carls_run_member_stem(stem, sizeof stem, &r->shard[i]);
        rc = fn(r, stem);
    }
    if (r->replicas > 1 && rc == 0) {
        rc = fn(r, CARLS_LAUNCHER_KEY_STEM); /* its `kbctl replica` calls: probes, fences, promotions */
    }
    return rc ? rc : fn(r, "trainer");
}

void carls_run_member_stem(char *stem, size_t len, const carls_shard_t *b)
{
    carls_fmt(stem, len, "kb-server-%d-m%d", b->index, b->member);
}

void carls_run_curve_client_args(carls_argv_t *a, const carls_run_t *r, const char *stem)
{
    if (r->curve) {
        carls_argv_add(a, "--curve-key");
        carls_argv_add(a, "%s/%s.key", r->client_keys, stem);
        carls_argv_add_list(a, (const char *const[]){"--curve-server-key", r->server_pub, NULL});
    }
}

void carls_run_bank_client_args(carls_argv_t *a, const carls_run_t *r, const char *stem)
{
    carls_argv_add_list(a, (const char *const[]){"--kb", r->endpoints, NULL});
    carls_run_curve_client_args(a, r, stem);
}

void carls_run_event(carls_run_t *r, const char *fmt, ...)
{
    if (r->elen + 64 >= sizeof r->events) {
        return;
    }
    r->elen += (size_t)snprintf(r->events + r->elen, sizeof r->events - r->elen, "| %.1f | ", carls_run_elapsed(r));
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(r->events + r->elen, sizeof r->events - r->elen, fmt, ap);
    va_end(ap);
    r->elen = n < 0 ? r->elen : r->elen + (size_t)n < sizeof r->events ? r->elen + (size_t)n : sizeof r->events - 1;
    if (r->elen + 3 < sizeof r->events) {
        r->elen += (size_t)snprintf(r->events + r->elen, sizeof r->events - r->elen, " |\n");
    }
}

int carls_run_supervise(carls_run_t *r)
{
    if (r->bank_lost) {
        return -1;
    }
    if (carls_shards_supervise(r) != 0) {
        return -1;
    }
    carls_fleet_supervise(r);
    return 0;
}

/* The rest of the result line: each of the trainer's values named in show (NULL-terminated) that it printed,
 * then the run's fault counts and wall time. */
static void s_print_result_line(const carls_run_t *r, const carls_result_t *res, const char *const *show, double wall)
{
    for (int i = 0; show[i]; i++) {
        const double *x = carls_result_get(res, show[i]);
        if (x) {
            printf("%s=%.6g ", show[i], *x);
        }
    }
    printf("shards=%d curve=%d ", r->n_shards, r->curve ? 1 : 0);
    if (r->replicas > 1) {
        printf("replicas=%d bank_failovers=%d failover_s=%.2f ", r->replicas, r->bank_failovers, r->failover_worst_s);
    }
    printf("bank_restarts=%d maker_deaths=%d maker_restarts=%d wall_s=%.1f\n", r->bank_restarts, r->maker_deaths,
           r->maker_restarts, wall);
}

/* Prints the two-tower run's result line; returns the launcher's status. */
static int s_twotower_result(const carls_run_t *r, const carls_result_t *res, int plotted, double wall)
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

/* Names the run's files and gives it a fresh directory: the bank, checkpoints and logs of an earlier run with
 * this name go, and run.ini records the settings (for --resume). With --resume the directory is the one given
 * and its files stay (logs and trainer.out are appended to; processes.tsv is kept as
 * processes.before-resume.tsv); only the keys are made anew. Returns 0, or -1 after reporting. */
static int s_prepare_dir(carls_run_t *r)
{
    const carls_config_t *c = r->c;
    if (r->resume_dir || r->restart_dir) {
        carls_fmt(r->dir, sizeof r->dir, "%s", r->resume_dir ? r->resume_dir : r->restart_dir);
    } else {
        carls_fmt(r->dir, sizeof r->dir, "%s/%s", c->runs_dir, c->name);
    }
    carls_resume_prefix(c->name, r->snap_prefix, sizeof r->snap_prefix);
    carls_fmt(r->logs, sizeof r->logs, "%s/logs", r->dir);
    carls_fmt(r->ckpt, sizeof r->ckpt, "%s/ckpt", r->dir);
    carls_fmt(r->metrics, sizeof r->metrics, "%s/metrics.csv", r->dir);
    carls_fmt(r->out, sizeof r->out, "%s/trainer.out", r->dir);
    carls_fmt(r->ptab_path, sizeof r->ptab_path, "%s/processes.tsv", r->dir);
    carls_fmt(r->keys, sizeof r->keys, "%s/keys", r->dir);
    carls_fmt(r->server_key, sizeof r->server_key, "%s/server.key", r->keys);
    carls_fmt(r->server_pub, sizeof r->server_pub, "%s/server.pub", r->keys);
    carls_fmt(r->client_keys, sizeof r->client_keys, "%s/clients", r->keys);
    r->curve = strcmp(c->curve, "on") == 0;
    r->n_shards = (int)c->shards;
    r->replicas = (int)c->replicas;
    r->n_members = r->n_shards * r->replicas;
    carls_fmt(r->replication_tsv, sizeof r->replication_tsv, "%s/replication.tsv", r->dir);
    for (int i = 0; i < r->n_members; i++) {
        carls_shard_t *b = &r->shard[i];
        b->index = i / r->replicas;
        b->member = i % r->replicas;
        /* Member 0 keeps an unreplicated shard's names (kb, kb-I); the others add -mM. */
        char m[16] = "";
        if (b->member) {
            carls_fmt(m, sizeof m, "-m%d", b->member);
        }
        if (r->replicas == 1) {
            carls_fmt(b->name, sizeof b->name, "kb-server %d/%d", b->index, r->n_shards);
        } else {
            carls_fmt(b->name, sizeof b->name, "kb-server %d/%d member %d", b->index, r->n_shards, b->member);
        }
        carls_fmt(b->what, sizeof b->what, "%s", r->n_members == 1 ? "kb-server" : b->name);
        carls_fmt(b->log, sizeof b->log, "%s/kb-server-%d%s.log", r->logs, b->index, m);
        if (r->n_shards == 1) {
            carls_fmt(b->dir, sizeof b->dir, "%s/kb%s", r->dir, m);
            carls_fmt(b->epfile, sizeof b->epfile, "%s/kb%s.endpoint", r->dir, m);
        } else {
            carls_fmt(b->dir, sizeof b->dir, "%s/kb-%d%s", r->dir, b->index, m);
            carls_fmt(b->epfile, sizeof b->epfile, "%s/kb-%d%s.endpoint", r->dir, b->index, m);
        }
    }
    for (int i = 0; i < r->n_shards; i++) {
        r->set[i] = (carls_replica_set_t){.primary = 0, .term = 1, .k = (int)c->min_replicas,
                                          .k_now = (int)c->min_replicas};
    }
    /* Whatever an earlier run of this name left, whatever its number of shards. */
    char cmd[9000];
    if (r->resume_dir) {
        carls_fmt(cmd, sizeof cmd, "cd '%s' && rm -rf keys && { [ ! -e processes.tsv ] || mv -f processes.tsv "
              "processes.before-resume.tsv; }", r->dir);
    } else {
        /* A restart keeps run.ini: it is the configuration being run. */
        carls_fmt(cmd, sizeof cmd, "cd '%s' 2>/dev/null || exit 0; rm -rf kb kb.endpoint kb-[0-9]* kb-m[0-9]* ckpt logs keys "
              "replication.tsv metrics.csv trainer.out processes.tsv processes.before-resume.tsv %s", r->dir,
              r->restart_dir ? "" : CARLS_RESUME_SETTINGS);
    }
    if (system(cmd) != 0 || carls_mkdir_p(r->logs, 0755, NULL, 0) != 0) {
        fprintf(stderr, "carls: cannot prepare %s\n", r->dir);
        return -1;
    }
    char settings[4400], err[1024];
    carls_fmt(settings, sizeof settings, "%s/%s", r->dir, CARLS_RESUME_SETTINGS);
    if (!r->resume_dir && !r->restart_dir &&
        carls_resume_write_settings(settings, r->config, r->ini, err, sizeof err) != 0) {
        fprintf(stderr, "carls: %s\n", err);
        return -1;
    }
    return 0;
}

/* What this run will do, in one line. */
static void s_print_plan(const carls_run_t *r)
{
    const carls_config_t *c = r->c;
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
static int s_keygen(carls_run_t *r, const char *path)
{
    char prog[4200], log[4400];
    carls_fmt(prog, sizeof prog, "%s/kb-keygen", r->c->bin);
    carls_fmt(log, sizeof log, "%s/keygen.log", r->logs);
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
static int s_make_client_key(carls_run_t *r, const char *stem)
{
    char path[4500];
    carls_fmt(path, sizeof path, "%s/%s", r->client_keys, stem);
    r->n_client_keys++;
    return s_keygen(r, path);
}

/* curve = on: the run's keys, made before any server starts (a server reads its allow-list once):
 * keys/server.key and .pub (every shard's pair) and keys/clients/STEM.key and .pub for each client process
 * (s_each_client). The directories are 0700 and the secret keys 0600; a process is given only its own
 * secret key, and the servers admit exactly the public keys in keys/clients. Returns 0 or -1 (logged). */
static int s_make_keys(carls_run_t *r)
{
    char err[512];
    if (carls_mkdir_p(r->client_keys, 0700, err, sizeof err) != 0 || chmod(r->keys, 0700) != 0 ||
        chmod(r->client_keys, 0700) != 0) {
        LOG_ERROR("cannot make %s: %s", r->client_keys, *err ? err : strerror(errno));
        return -1;
    }
    char server[4400];
    carls_fmt(server, sizeof server, "%s/server", r->keys);
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

/* 5. Stops everything: the trainer, the makers (SIGTERM to all, then each waited for), then the bank's
 * shards (likewise). */
static void s_stop_all(carls_run_t *r)
{
    if (r->trainer.running) {
        carls_proc_stop(&r->trainer, 10000);
        carls_ptab_ended(&r->ptab, r->trainer_row, &r->trainer, "stopped by the launcher");
    }
    carls_fleet_stop(r);
    carls_shards_stop(r);
}

/* Prints the graphreg run's result line (accuracy first); returns the launcher's status. */
static int s_graphreg_result(const carls_run_t *r, const carls_result_t *res, int plotted, double wall)
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
static int s_report(carls_run_t *r, double wall)
{
    const carls_config_t *c = r->c;
    carls_result_t res;
    carls_result_read(&res, r->out);
    const int64_t t0 = carls_monotonic_ms();
    char knowledge[4400]; /* the knowledge per refresh from the makers' logs, for the report and its plots */
    carls_fmt(knowledge, sizeof knowledge, "%s/" CARLS_KNOWLEDGE_CSV, r->dir);
    carls_knowledge_write(r->logs, knowledge);
    int plotted = carls_report_plots(r->dir, r->metrics, c->experiment) == 0;
    carls_stages_add(&r->stages, "report", (double)(carls_monotonic_ms() - t0) / 1000.0,
                     "report: knowledge per refresh%s", plotted ? " and plots (gnuplot)" : "");
    r->total_s = carls_run_elapsed(r);
    char *stages = carls_xmalloc(8192);
    carls_stages_table(&r->stages, r->total_s, stages, 8192);
    const double *skipped = carls_result_get(&res, "bank_fetches_skipped");
    char faults[10240];
    snprintf(faults, sizeof faults,
             "kb-server restarts: %d (max_bank_restarts = %d per kb-server), failovers (a follower promoted): %d, "
             "maker deaths: %d, maker restarts: %d "
             "(max_maker_restarts = %d), trainer batches without the bank: %.0f. Every process: "
             "`processes.tsv`.\n\n%s%s",
             r->bank_restarts, (int)c->max_bank_restarts, r->bank_failovers, r->maker_deaths, r->maker_restarts,
             (int)c->max_maker_restarts, skipped ? *skipped : 0.0,
             r->elen ? "| at (s) | what happened |\n| --- | --- |\n" : "No process died.\n", r->events);
    carls_report_write(r->dir, r->config, r->ini, &res, stages, faults, plotted);
    free(stages);
    return r->tt ? s_twotower_result(r, &res, plotted, wall) : s_graphreg_result(r, &res, plotted, wall);
}

/* Phases 1-4, then 5 whatever happened; returns the launcher's status. */
static int s_run(carls_run_t *r)
{
    const carls_config_t *c = r->c;
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
    for (int i = 0; i < r->n_members; i++) {
        r->shard[i].row = -1;
    }
    r->trainer_row = -1;
    r->fleet_argv = carls_xcalloc(CARLS_PROC_MAX, sizeof *r->fleet_argv);
    carls_ptab_init(&r->ptab, r->ptab_path);
    s_print_plan(r);
    if (*r->note) {
        carls_run_event(r, "%s", r->note);
    }
    carls_config_write_metrics_targets(c, r->dir, r->tt, r->embed_fleet, r->graph_refresh, r->label_loop);
    bool ready = !r->curve || s_make_keys(r) == 0;
    if (ready && r->resume_dir) {
        ready = carls_shards_resume(r) == 0; /* the graph and pseudo-labels come back with the snapshot */
    } else if (ready) {
        const int64_t t_bank = carls_monotonic_ms();
        ready = carls_shards_start(r, NULL) == 0;
        char bank[96];
        carls_stages_add(&r->stages, "bank_startup", (double)(carls_monotonic_ms() - t_bank) / 1000.0,
                         "bank: %s%s", carls_shards_words(r, bank, sizeof bank), ready ? "" : " (failed)");
        ready = ready && (!r->graph_needed || carls_fleet_initial_graph(r) == 0);
    }
    int64_t t = carls_monotonic_ms();
    if (ready && carls_fleet_start(r) == 0) {
        carls_stages_add(&r->stages, "makers_start", (double)(carls_monotonic_ms() - t) / 1000.0,
                         "resident makers started (%d process%s)", r->n_fleet, r->n_fleet == 1 ? "" : "es");
        t = carls_monotonic_ms();
        if (carls_train_run(r) == 0) {
            carls_train_stages(r, (double)(carls_monotonic_ms() - t) / 1000.0);
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
    carls_fmt(path, sizeof path, "%s/" CARLS_STAGES_JSON, r->dir);
    if (carls_stages_write_json(path, &r->stages, r->total_s > 0 ? r->total_s : carls_run_elapsed(r), c->name,
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
    carls_fmt(settings, settings_len, "%s/%s", argv[2], CARLS_RESUME_SETTINGS);
    if (access(settings, R_OK) != 0) {
        fprintf(stderr, "carls: --resume %s: no %s in it (%s): not a run directory of carls run, or one made by an "
                        "older build\n", argv[2], CARLS_RESUME_SETTINGS, strerror(errno));
        return 2;
    }
    return 0;
}

/* Whether the run in dir (settings c) stopped before the trainer wrote its first checkpoint: nothing to resume
 * from, so --resume starts it again from the beginning, and says so. A checkpoint directory that cannot be
 * read is not that case (carls_shards_resume names the problem). */
static bool s_nothing_to_resume(const char *dir, const carls_config_t *c)
{
    char ckpt[4400];
    carls_fmt(ckpt, sizeof ckpt, "%s/ckpt", dir);
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
               "  e.g. --set shards=2 (a bank of 2 kb-servers) --set curve=on (CURVE keys for every process)\n"
               "  --set replicas=2 (each shard a primary and a follower, promoted when the primary dies; with\n"
               "  kb_durability=sync every acknowledged write is on both);\n"
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
    carls_config_t c;
    bool quiet = false;
    char note[1600];
    int status = carls_config_load(argc, argv, ini, &c, &quiet, note, sizeof note);
    if (status == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = s_on_signal;
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        carls_run_t *r = carls_xcalloc(1, sizeof *r);
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
