/* The run's makers (see carls_fleet.h). */
#include "carls_fleet.h"

#include "carls_run_internal.h"

#include "log.h"
#include "util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* How long a maker waits for one answer before it resends (and so how soon it notices a restarted bank). */
static void s_maker_timeout_arg(carls_argv_t *a, const carls_config_t *c)
{
    if (c->maker_bank_timeout_ms > 0) {
        carls_argv_add(a, "--bank-timeout-ms");
        carls_argv_add(a, "%d", (int)c->maker_bank_timeout_ms);
    }
}

/* Common maker arguments: the bank (as maker `stem`), the task and this maker's share. */
static void s_maker_args(carls_argv_t *a, const carls_run_t *r, const char *stem, const char *task, int worker,
                         int workers)
{
    const carls_config_t *c = r->c;
    char worker_text[32], items[32];
    carls_fmt(worker_text, sizeof worker_text, "%d/%d", worker, workers);
    carls_fmt(items, sizeof items, "%d", (int)c->items);
    carls_argv_add(a, "%s/kb-maker", c->bin);
    carls_run_bank_client_args(a, r, stem);
    carls_argv_add_list(a, (const char *const[]){"--task", task, "--worker", worker_text, "--tables", c->tables,
                                                 "--items", items, "--device", c->maker_device, NULL});
    carls_argv_add_if_set(a, "--data", c->data);
    carls_argv_add_if_set(a, "--data-dir", c->data_dir);
    s_maker_timeout_arg(a, c);
}

/* A resident maker (fleet[i]) died: count it, and restart it unless max_maker_restarts are used up. */
static void s_maker_died(carls_run_t *r, int i)
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
        carls_run_event(r, "%s (pid %d) %s; not restarted, the others carry on", p->name, (int)p->started_pid, how);
        carls_ptab_ended(&r->ptab, r->fleet_row[i], p, "died: not restarted (max_maker_restarts used up)");
        return;
    }
    r->maker_restarts++;
    LOG_WARN("%s %s; restarting it (%d/%d); the other makers and the trainer carry on", p->name, how,
             r->maker_restarts, max);
    const carls_proc_t dead = *p;
    char name[64];
    carls_fmt(name, sizeof name, "%s", p->name);
    if (carls_proc_start(p, name, r->fleet_argv[i].ptr, r->fleet_log[i], r->fleet_log[i]) != 0) {
        *p = dead; /* not running: nothing more to supervise */
        carls_ptab_ended(&r->ptab, r->fleet_row[i], &dead, "died: the restart failed");
        return;
    }
    carls_fmt(note, sizeof note, "died: restarted as pid %d (%d/%d)", (int)p->started_pid, r->maker_restarts, max);
    carls_ptab_ended(&r->ptab, r->fleet_row[i], &dead, note);
    carls_fmt(note, sizeof note, "restart %d/%d (pid %d died)", r->maker_restarts, max, (int)dead.started_pid);
    r->fleet_row[i] = carls_ptab_started(&r->ptab, "maker", p, note);
    carls_run_event(r, "%s (pid %d) %s; restarted as pid %d (%d/%d)", name, (int)dead.started_pid, how,
                    (int)p->started_pid, r->maker_restarts, max);
}

/* One-shot maker p (processes.tsv row *row, argv a, log file log) has ended: finished, restarted when a
 * signal killed it (within max_maker_restarts, while the phase has not failed: *rc == 0), else failed
 * (*rc = -1). Returns whether it runs again. */
static bool s_once_ended(carls_run_t *r, carls_proc_t *p, int *row, const carls_argv_t *a, const char *log, int *rc)
{
    const int max = (int)r->c->max_maker_restarts;
    char how[96];
    carls_proc_describe(p, how, sizeof how);
    if (p->status == 0) {
        carls_ptab_ended(&r->ptab, *row, p, "finished");
        return false;
    }
    if (p->signal && !carls_run_interrupted() && *rc == 0 && r->maker_restarts < max) {
        r->maker_deaths++;
        r->maker_restarts++;
        LOG_WARN("%s %s; restarting it (%d/%d)", p->name, how, r->maker_restarts, max);
        const carls_proc_t dead = *p;
        char name[64], note[128];
        carls_fmt(name, sizeof name, "%s", dead.name);
        if (carls_proc_start(p, name, a->ptr, log, log) != 0) {
            *p = dead;
            carls_ptab_ended(&r->ptab, *row, &dead, "died: the restart failed");
            *rc = -1;
            return false;
        }
        carls_fmt(note, sizeof note, "died: restarted as pid %d (%d/%d)", (int)p->started_pid, r->maker_restarts, max);
        carls_ptab_ended(&r->ptab, *row, &dead, note);
        *row = carls_ptab_started(&r->ptab, "maker", p, "one-shot, restarted");
        carls_run_event(r, "%s (pid %d) %s; restarted as pid %d (%d/%d)", name, (int)dead.started_pid, how,
                (int)p->started_pid, r->maker_restarts, max);
        return true;
    }
    if (p->signal && !carls_run_interrupted()) {
        r->maker_deaths++;
    }
    if (!carls_run_interrupted()) {
        LOG_ERROR("%s %s (see %s)", p->name, how, log);
    }
    carls_ptab_ended(&r->ptab, *row, p, carls_run_interrupted() ? "stopped by the launcher" : "failed");
    *rc = -1;
    return false;
}

/* Runs a fleet of `n` one-shot makers to completion, supervising the bank meanwhile. A maker killed by a
 * signal is started again (within max_maker_restarts); one that fails on its own fails the phase. Returns 0,
 * or -1 when one failed, the bank is gone or we were stopped. */
static int s_fleet_once(carls_run_t *r, const char *label, const char *task, int n, const char *const *extra,
                        double *seconds)
{
    carls_proc_t p[CARLS_PROC_MAX];
    int row[CARLS_PROC_MAX];
    carls_argv_t *a = carls_xcalloc((size_t)n, sizeof *a);
    char (*log)[4400] = carls_xcalloc((size_t)n, sizeof *log);
    int64_t t0 = carls_monotonic_ms();
    int started = 0, rc = 0;
    for (int i = 0; i < n; i++) {
        char stem[64];
        carls_run_once_stem(stem, sizeof stem, label, i);
        s_maker_args(&a[i], r, stem, task, i, n);
        carls_argv_add(&a[i], "--once");
        for (int e = 0; extra && extra[e]; e++) {
            carls_argv_add(&a[i], "%s", extra[e]);
        }
        char name[64];
        carls_fmt(name, sizeof name, "%s %d/%d", label, i, n);
        carls_fmt(log[i], sizeof log[0], "%s/%s.log", r->logs, stem);
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
        if (carls_run_supervise(r) != 0 || carls_run_interrupted() || rc != 0) {
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
    return carls_run_interrupted() ? -1 : rc;
}

/* Starts resident maker number r->n_fleet with argv a (copied) and log file log. */
static int s_fleet_start(carls_run_t *r, const char *name, const carls_argv_t *a, const char *log)
{
    const int i = r->n_fleet;
    carls_argv_copy(&r->fleet_argv[i], a);
    carls_fmt(r->fleet_log[i], sizeof r->fleet_log[0], "%s", log);
    if (carls_proc_start(&r->fleet[i], name, r->fleet_argv[i].ptr, log, log) != 0) {
        return -1;
    }
    r->fleet_row[i] = carls_ptab_started(&r->ptab, "maker", &r->fleet[i], NULL);
    r->n_fleet++;
    return 0;
}

int carls_fleet_initial_graph(carls_run_t *r)
{
    const carls_config_t *c = r->c;
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
    carls_fmt(kbuf, sizeof kbuf, "%d", (int)c->graph_k);
    const char *gr[] = {"--source", "pixels", "--k", kbuf, NULL};
    rc = s_fleet_once(r, "graph", "graph", n, gr, &s);
    carls_stages_add(&r->stages, "initial_graph", s, "initial graph: k=%d neighbours by graph makers (%d)%s",
                     (int)c->graph_k, n, rc ? " (failed)" : "");
    if (rc != 0) {
        return -1;
    }
    if (r->label_first) {
        char lpc[32], lseed[32], sa_[32], si[32], bal[32];
        carls_fmt(lpc, sizeof lpc, "%d", (int)c->labels_per_class);
        carls_fmt(lseed, sizeof lseed, "%d", (int)c->label_seed);
        carls_fmt(sa_, sizeof sa_, "%g", c->spread_alpha);
        carls_fmt(si, sizeof si, "%d", (int)c->spread_iters);
        carls_fmt(bal, sizeof bal, "%d", (int)c->label_balance);
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
static int s_fleet_start_worker(carls_run_t *r, const char *task, int i, int n, const carls_argv_t *a)
{
    char name[64], stem[64], log[4400];
    carls_fmt(name, sizeof name, "maker %s %d/%d", task, i, n);
    carls_run_resident_stem(stem, sizeof stem, task, i);
    carls_fmt(log, sizeof log, "%s/%s.log", r->logs, stem);
    return s_fleet_start(r, name, a, log);
}

/* The word-tower maker i/n (experiment = twotower). */
static int s_start_words_maker(carls_run_t *r, int i, int n)
{
    const carls_config_t *c = r->c;
    carls_argv_t a = {0};
    char stem[64];
    carls_run_resident_stem(stem, sizeof stem, "words", i);
    carls_argv_add(&a, "%s/kb-maker", c->bin);
    carls_run_bank_client_args(&a, r, stem);
    const char *const fixed[] = {"--task", "words", "--tables", c->tables, "--ckpt-dir", r->ckpt, NULL};
    carls_argv_add_list(&a, fixed);
    carls_argv_add(&a, "--worker");
    carls_argv_add(&a, "%d/%d", i, n);
    s_maker_timeout_arg(&a, c);
    carls_config_metrics_arg(&a, c, CARLS_METRICS_MAKERS + 2 * (int)c->makers + i);
    carls_argv_add_if_set(&a, "--data", c->data);
    carls_argv_add_if_set(&a, "--gcide-index", c->gcide_index);
    carls_argv_add_if_set(&a, "--gcide-dict", c->gcide_dict);
    return s_fleet_start_worker(r, "words", i, n, &a);
}

/* The resident label maker (graph + model predictions). */
static int s_start_label_maker(carls_run_t *r)
{
    const carls_config_t *c = r->c;
    carls_argv_t a = {0};
    char stem[64];
    carls_run_resident_stem(stem, sizeof stem, "label", 0);
    s_maker_args(&a, r, stem, "label", 0, 1);
    carls_config_metrics_arg(&a, c, CARLS_METRICS_MAKERS + 3 * (int)c->makers);
    carls_argv_add(&a, "--ckpt-dir");
    carls_argv_add(&a, "%s", r->ckpt);
    const carls_argv_num_t nums[] = {
        {"--labels-per-class", c->labels_per_class, 1}, {"--label-seed", c->label_seed, 1},
        /* graph_refresh 2: rows of 2k, the learned embeddings' k then the pixels' k */
        {"--k", c->graph_refresh == 2 ? 2 * c->graph_k : c->graph_k, 1}, {"--spread-alpha", c->spread_alpha, 0},
        {"--spread-iters", c->spread_iters, 1},         {"--balance", c->label_balance, 1},
        {"--model-weight", c->label_model_weight, 0},
    };
    carls_argv_add_nums(&a, nums, sizeof nums / sizeof nums[0]);
    if (r->graph_refresh) {
        carls_argv_add(&a, "--wait-graph");
    }
    return s_fleet_start_worker(r, "label", 0, 1, &a);
}

int carls_fleet_start(carls_run_t *r)
{
    const carls_config_t *c = r->c;
    const int n = (int)c->makers;
    char stem[64];
    for (int i = 0; r->embed_fleet && i < n; i++) {
        carls_argv_t a = {0};
        carls_run_resident_stem(stem, sizeof stem, "embed", i);
        s_maker_args(&a, r, stem, "embed", i, n);
        carls_config_metrics_arg(&a, c, CARLS_METRICS_MAKERS + i);
        carls_argv_add(&a, "--ckpt-dir");
        carls_argv_add(&a, "%s", r->ckpt);
        if (s_fleet_start_worker(r, "embed", i, n, &a) != 0) {
            return -1;
        }
    }
    for (int i = 0; r->graph_refresh && i < n; i++) {
        carls_argv_t a = {0};
        carls_run_resident_stem(stem, sizeof stem, "graph", i);
        s_maker_args(&a, r, stem, "graph", i, n);
        carls_config_metrics_arg(&a, c, CARLS_METRICS_MAKERS + n + i);
        char k[32];
        carls_fmt(k, sizeof k, "%d", (int)c->graph_k);
        carls_argv_add_list(&a, (const char *const[]){"--source", c->graph_refresh == 2 ? "emb+pixels" : "emb", "--k",
                                                      k, "--ckpt-dir", r->ckpt, NULL});
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

void carls_fleet_supervise(carls_run_t *r)
{
    for (int i = 0; i < r->n_fleet; i++) {
        if (r->fleet[i].running && carls_proc_poll(&r->fleet[i])) {
            s_maker_died(r, i);
        }
    }
}

void carls_fleet_stop(carls_run_t *r)
{
    for (int i = 0; i < r->n_fleet; i++) {
        if (r->fleet[i].running && carls_proc_poll(&r->fleet[i])) {
            char how[96];
            r->maker_deaths++;
            LOG_WARN("%s %s while the run was ending", r->fleet[i].name,
                     carls_proc_describe(&r->fleet[i], how, sizeof how));
            carls_run_event(r, "%s (pid %d) %s while the run was ending", r->fleet[i].name,
                            (int)r->fleet[i].started_pid, how);
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
}
