/* The bank's shards (see carls_shards.h). */
#include "carls_shards.h"

#include "carls_run_internal.h"

#include "files.h"
#include "log.h"
#include "util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Shard b's kb-server arguments: a free loopback port (--listen is replaced by the bound endpoint once it
 * listens, so a restart comes back on the same one), its data directory, --shard I/N when the bank has
 * several shards and, with curve = on, the run's server key and its clients' allow-list. */
static void s_server_args(carls_argv_t *a, const carls_run_t *r, carls_shard_t *b)
{
    const carls_config_t *c = r->c;
    carls_argv_add(a, "%s/kb-server", c->bin);
    carls_argv_add(a, "--listen");
    b->listen_arg = a->n;
    carls_argv_add(a, "tcp://127.0.0.1:*");
    carls_argv_add_list(a, (const char *const[]){"--endpoint-file", b->epfile, "--data", b->dir, "--durability",
                                        c->kb_durability, NULL});
    carls_argv_add(a, "--threads");
    carls_argv_add(a, "%d", (int)c->kb_threads);
    carls_config_metrics_arg(a, c, b->index);
    if (r->n_shards > 1) {
        carls_argv_add(a, "--shard");
        carls_argv_add(a, "%d/%d", b->index, r->n_shards);
    }
    if (r->curve) {
        carls_argv_add_list(
            a, (const char *const[]){"--curve-secret", r->server_key, "--curve-allow", r->client_keys, NULL});
    }
}

/* Shard b's kb-server died: restart it with the same flags, data directory and endpoint, unless its
 * max_bank_restarts are used up (then r->bank_lost). Returns 0, or -1 when the run must stop. */
static int s_bank_died(carls_run_t *r, carls_shard_t *b)
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
        carls_run_event(r, "%s (pid %d) %s; no restarts left: the run stops", b->what, (int)b->proc.started_pid, how);
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
    carls_fmt(note, sizeof note, "died: restarted as pid %d (%d/%d)", (int)b->proc.started_pid, b->restarts, max);
    carls_ptab_ended(&r->ptab, dead_row, &dead, note);
    carls_fmt(note, sizeof note, "restart %d/%d of %s (pid %d)", b->restarts, max, b->name, (int)dead.started_pid);
    b->row = carls_ptab_started(&r->ptab, "kb-server", &b->proc, note);
    carls_run_event(r, "%s (pid %d) %s; restarted as pid %d (%d/%d)", b->what, (int)dead.started_pid, how,
            (int)b->proc.started_pid, b->restarts, max);
    b->wait_deadline = carls_monotonic_ms() + 300 * 1000;
    return 0;
}

/* Shard b restarted: once it has written its endpoint file, says so (and that clients reconnect); kills it
 * when it is not listening by its deadline (the next round restarts it again). */
static void s_bank_watch_restart(carls_run_t *r, carls_shard_t *b)
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
        carls_run_event(r, "%s (pid %d) listening again, %.1f s after it died", b->what, (int)b->proc.started_pid,
                        away);
        b->wait_deadline = 0;
        b->down_ms = 0;
    } else if (carls_monotonic_ms() > b->wait_deadline) {
        LOG_ERROR("the restarted %s (pid %d) is not listening after 300 s: killing it (see %s)", b->what,
                  (int)b->proc.started_pid, b->log);
        kill(b->proc.pid, SIGKILL);
        b->wait_deadline = 0;
    }
}

int carls_shards_start(carls_run_t *r, const char *restore)
{
    const carls_config_t *c = r->c;
    r->endpoints[0] = '\0';
    for (int i = 0; i < r->n_shards; i++) {
        carls_shard_t *b = &r->shard[i];
        memset(&b->argv, 0, sizeof b->argv);
        b->endpoint[0] = '\0';
        unlink(b->epfile); /* a killed run's: not this server's */
        s_server_args(&b->argv, r, b);
        /* --restore only for this start: a restart later must not go back to the snapshot. */
        carls_argv_t *first = &b->argv, *with = NULL;
        if (restore) {
            with = carls_xmalloc(sizeof *with);
            carls_argv_copy(with, &b->argv);
            carls_argv_add_list(with, (const char *const[]){"--restore", restore, NULL});
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
        carls_shard_t *b = &r->shard[i];
        for (int t = 0; t < 600 && !carls_run_interrupted() && !*b->endpoint; t++) {
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

const char *carls_shards_words(const carls_run_t *r, char *buf, size_t len)
{
    carls_fmt(buf, len, "%d kb-server%s%s", r->n_shards, r->n_shards == 1 ? "" : "s (shards)",
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

/* Stops the shards that carls_shards_start started (one refused its --restore), noting why in processes.tsv; the
 * reason each exited shard gave (its log's last line) is appended to why (whylen bytes). */
static void s_stop_bank(carls_run_t *r, const char *snapshot, char *why, size_t whylen)
{
    for (int i = 0; i < r->n_shards; i++) {
        carls_shard_t *b = &r->shard[i];
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

int carls_shards_resume(carls_run_t *r)
{
    const int64_t t0 = carls_monotonic_ms();
    const char *dirs[CARLS_MAX_SHARDS];
    for (int i = 0; i < r->n_shards; i++) {
        dirs[i] = r->shard[i].dir;
    }
    carls_resume_candidates_t *cand = carls_xcalloc(1, sizeof *cand);
    char *refused = carls_xcalloc(1, 8192);
    const bool need_snapshot = r->graph_needed || r->tt; /* twotower: the rows it trains are in the bank */
    const int n = carls_resume_candidates(r->ckpt, need_snapshot, dirs, r->n_shards, cand);
    int rc = -1;
    for (int k = 0; k < n && rc != 0 && !carls_run_interrupted(); k++) {
        const carls_resume_pair_t *p = &cand->pair[k];
        rc = carls_shards_start(r, need_snapshot ? p->snapshot : NULL);
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
            carls_run_event(r, "--resume passed over newer checkpoints (see the launcher's log)");
        }
        const char *snap = *r->resumed.snapshot ? r->resumed.snapshot : "none: the run does not use the bank";
        printf("[carls] resumed from step %llu (checkpoint %s, snapshot %s)\n", r->resumed.step, r->resumed.path,
               snap);
        fflush(stdout);
        carls_run_event(r, "resumed from step %llu (checkpoint `%s`, snapshot `%s`)", r->resumed.step, r->resumed.path,
                snap);
    }
    char bank[96];
    carls_stages_add(&r->stages, "bank_restore", (double)(carls_monotonic_ms() - t0) / 1000.0,
                     "bank: %s, %s%s (--resume)", carls_shards_words(r, bank, sizeof bank),
                     rc == 0 ? "restored from snapshot " : "no snapshot restored", rc == 0 ? r->resumed.snapshot : "");
    free(refused);
    free(cand);
    return rc;
}

int carls_shards_supervise(carls_run_t *r)
{
    for (int i = 0; i < r->n_shards; i++) {
        carls_shard_t *b = &r->shard[i];
        if (b->proc.running && carls_proc_poll(&b->proc) && s_bank_died(r, b) != 0) {
            return -1;
        }
        if (b->wait_deadline && b->proc.running) {
            s_bank_watch_restart(r, b);
        }
    }
    return 0;
}

void carls_shards_stop(carls_run_t *r)
{
    for (int i = 0; i < r->n_shards; i++) {
        carls_shard_t *b = &r->shard[i];
        if (b->proc.running && carls_proc_poll(&b->proc)) {
            char how[96];
            LOG_WARN("%s %s before the launcher stopped it", b->what, carls_proc_describe(&b->proc, how, sizeof how));
            carls_ptab_ended(&r->ptab, b->row, &b->proc, "died: the run was ending");
        } else if (b->proc.running) {
            kill(b->proc.pid, SIGTERM); /* every shard checkpoints at once */
        }
    }
    for (int i = 0; i < r->n_shards; i++) {
        carls_shard_t *b = &r->shard[i];
        if (b->proc.running) {
            int server_status = carls_proc_stop(&b->proc, 30000);
            carls_ptab_ended(&r->ptab, b->row, &b->proc, "stopped by the launcher");
            if (server_status != 0) {
                LOG_WARN("%s ended with status %d", b->what, server_status);
            }
        }
    }
}
