/* The bank's shards (see carls_shards.h). */
#include "carls_shards.h"

#include "carls_replicas.h"
#include "carls_run_internal.h"

#include "files.h"
#include "log.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The client endpoint of the primary that member b follows; NULL when b is (or is to become) its shard's
 * primary, or the shard is not replicated. */
static const char *s_primary_of(const carls_run_t *r, const carls_shard_t *b)
{
    if (r->replicas == 1) {
        return NULL;
    }
    const carls_replica_set_t *set = &r->set[b->index];
    return set->primary == b->member ? NULL : r->shard[b->index * r->replicas + set->primary].endpoint;
}

/* Server b's kb-server arguments: its endpoint once it has listened (so a restart comes back on the same one),
 * else a free loopback port; its data directory, --shard I/N when the bank has several shards and, with
 * curve = on, the run's server key and its clients' allow-list. A member of a replicated shard is named, and
 * is either its primary (--replication-listen, with the K it runs with) or a follower of it (--replica-of). */
static void s_server_args(carls_argv_t *a, const carls_run_t *r, carls_shard_t *b)
{
    const carls_config_t *c = r->c;
    memset(a, 0, sizeof *a);
    carls_argv_add(a, "%s/kb-server", c->bin);
    carls_argv_add(a, "--listen");
    carls_argv_add(a, "%s", *b->endpoint ? b->endpoint : "tcp://127.0.0.1:*");
    carls_argv_add_list(a, (const char *const[]){"--endpoint-file", b->epfile, "--data", b->dir, "--durability",
                                        c->kb_durability, NULL});
    carls_argv_add(a, "--threads");
    carls_argv_add(a, "%d", (int)c->kb_threads);
    carls_config_metrics_arg(a, c, b->index + CARLS_MAX_SHARDS * b->member);
    if (r->n_shards > 1) {
        carls_argv_add(a, "--shard");
        carls_argv_add(a, "%d/%d", b->index, r->n_shards);
    }
    if (r->curve) {
        carls_argv_add_list(
            a, (const char *const[]){"--curve-secret", r->server_key, "--curve-allow", r->client_keys, NULL});
    }
    if (r->replicas > 1) {
        carls_argv_add(a, "--member");
        carls_argv_add(a, "%d.%d", b->index, b->member);
        const char *primary = s_primary_of(r, b);
        if (primary) {
            carls_argv_add_list(a, (const char *const[]){"--replica-of", primary, NULL});
            if (r->curve) {
                char stem[64];
                carls_run_member_stem(stem, sizeof stem, b);
                carls_argv_add(a, "--replica-curve-key");
                carls_argv_add(a, "%s/%s.key", r->client_keys, stem);
            }
        } else {
            carls_argv_add_list(a, (const char *const[]){"--replication-listen", "tcp://127.0.0.1:*", NULL});
            if (r->set[b->index].k_now > 0) {
                carls_argv_add(a, "--min-replicas");
                carls_argv_add(a, "%d", r->set[b->index].k_now);
            }
        }
    }
}

/* Starts server b again with the arguments its role has now (after its endpoint file is removed, so that the
 * new one shows when it listens), notes why in processes.tsv and watches it until it listens. Returns 0, or
 * -1 when it could not be started (r->bank_lost). */
static int s_restart(carls_run_t *r, carls_shard_t *b, const char *ended_note, const char *started_note)
{
    const carls_proc_t dead = b->proc;
    const int dead_row = b->row;
    unlink(b->epfile);
    s_server_args(&b->argv, r, b);
    if (carls_proc_start(&b->proc, b->name, b->argv.ptr, b->log, b->log) != 0) {
        carls_ptab_ended(&r->ptab, dead_row, &dead, "died: the restart failed");
        r->bank_lost = true;
        return -1;
    }
    char note[160];
    carls_fmt(note, sizeof note, "%s as pid %d", ended_note, (int)b->proc.started_pid);
    carls_ptab_ended(&r->ptab, dead_row, &dead, note);
    carls_fmt(note, sizeof note, "%s of %s (pid %d)", started_note, b->name, (int)dead.started_pid);
    b->row = carls_ptab_started(&r->ptab, "kb-server", &b->proc, note);
    b->wait_deadline = carls_monotonic_ms() + 300 * 1000;
    return 0;
}

/* After a promotion, a follower that still follows the old primary is started again as a follower of the new
 * one (not a fault: its restarts are not counted). */
static void s_repoint(carls_run_t *r, carls_shard_t *b)
{
    if (carls_proc_ended(&b->proc)) {
        return; /* dead: the supervision reaps and restarts it, as a follower of the new primary */
    }
    carls_proc_stop(&b->proc, 10000);
    if (s_restart(r, b, "stopped to follow the new primary: restarted", "re-pointed") == 0) {
        b->down_ms = carls_monotonic_ms();
        carls_run_event(r, "%s re-pointed to the new primary of shard %d (pid %d)", b->what, b->index,
                        (int)b->proc.started_pid);
    }
}

/* Promotes member b of its shard to primary in the next term, running with K = 0 until followers have caught
 * up (carls_shards_supervise raises it back). Returns 0, or -1 with kbctl's words logged. */
static int s_promote(carls_run_t *r, carls_shard_t *b, const char *why)
{
    carls_replica_set_t *set = &r->set[b->index];
    const uint64_t term = ++set->term; /* used or not, never given again */
    carls_replica_record(r, b->index, term, b->member, b->endpoint, 0, why);
    carls_replica_status_t st;
    char err[600];
    if (carls_replica_call(r, b->endpoint, "promote", term, 0, &st, err, sizeof err) != 0) {
        LOG_ERROR("shard %d: promoting %s to term %llu failed: %s", b->index, b->what, (unsigned long long)term, err);
        return -1;
    }
    set->primary = b->member;
    set->k_now = 0;
    set->next_check_ms = carls_monotonic_ms() + 1000;
    return 0;
}

/* The primary of b's shard (b) died: fences every live follower with the next term, promotes the one holding
 * the newest record (docs/REPLICATION.md, section 4; the primary is known dead, reaped here, so no lease is
 * waited for) and re-points the others to it. Returns 0 when a follower was promoted, -1 when none could be
 * (none alive or none answered): then b itself is to be promoted once it is restarted. */
static int s_failover(carls_run_t *r, carls_shard_t *dead)
{
    carls_replica_set_t *set = &r->set[dead->index];
    const uint64_t fence_term = set->term + 1;
    carls_shard_t *best = NULL;
    carls_replica_status_t best_st = {0}, st;
    char err[600];
    for (int m = 0; m < r->replicas; m++) {
        carls_shard_t *b = &r->shard[dead->index * r->replicas + m];
        if (b == dead || carls_proc_ended(&b->proc) || b->wait_deadline || !*b->endpoint) {
            continue; /* dead, or not listening yet after a restart: nothing to promote */
        }
        if (carls_replica_call(r, b->endpoint, "fence", fence_term, -1, &st, err, sizeof err) != 0) {
            LOG_WARN("shard %d: %s did not take the fence: %s", dead->index, b->what, err);
            continue;
        }
        if (!best || st.last_term > best_st.last_term ||
            (st.last_term == best_st.last_term && st.committed_epoch > best_st.committed_epoch)) {
            best = b;
            best_st = st;
        }
    }
    set->term = fence_term; /* fenced members hold it: the promotion takes the next */
    if (!best) {
        return -1;
    }
    char why[160];
    carls_fmt(why, sizeof why, "primary member %d died; member %d held epoch %llu of term %llu", dead->member,
              best->member, (unsigned long long)best_st.committed_epoch, (unsigned long long)best_st.last_term);
    if (s_promote(r, best, why) != 0) {
        return -1;
    }
    const double took = (double)(carls_monotonic_ms() - dead->down_ms) / 1000.0;
    r->bank_failovers++;
    r->failover_worst_s = took > r->failover_worst_s ? took : r->failover_worst_s;
    printf("[carls] shard %d: %s promoted to primary (term %llu, epoch %llu) %.2f s after the primary died; "
           "min_replicas 0 until a follower has caught up\n",
           dead->index, best->what, (unsigned long long)set->term, (unsigned long long)best_st.committed_epoch, took);
    fflush(stdout);
    carls_run_event(r, "shard %d: primary %s (pid %d) died; %s promoted (term %llu, epoch %llu) in %.2f s", dead->index,
                    dead->what, (int)dead->proc.started_pid, best->what, (unsigned long long)set->term,
                    (unsigned long long)best_st.committed_epoch, took);
    for (int m = 0; m < r->replicas; m++) {
        carls_shard_t *b = &r->shard[dead->index * r->replicas + m];
        if (b != dead && b != best) {
            s_repoint(r, b);
        }
    }
    return 0;
}

/* Whether a member of b's shard other than b is running (listening, or restarting). */
static bool s_followers_alive(const carls_run_t *r, const carls_shard_t *b)
{
    for (int m = 0; m < r->replicas; m++) {
        const carls_shard_t *o = &r->shard[b->index * r->replicas + m];
        if (o != b && o->proc.running) {
            return true;
        }
    }
    return false;
}

/* Server b died: restart it with its flags, data directory and endpoint, unless its max_bank_restarts are
 * used up (then r->bank_lost). The primary of a replicated shard is first replaced by a follower
 * (s_failover) and comes back as a follower of it. Returns 0, or -1 when the run must stop. */
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
    const bool was_primary = r->replicas > 1 && !s_primary_of(r, b);
    if (was_primary && !b->promote_when_up) {
        const int64_t now = carls_monotonic_ms();
        if (!b->failover_retry_ms) { /* the first try (down_ms: since when it is down) */
            LOG_WARN("%s (primary of shard %d) %s: promoting a follower", b->what, b->index, how);
        }
        if (s_failover(r, b) != 0) {
            /* A follower that is alive but did not answer (busy, or restarting) may yet: the dead primary stays
             * down meanwhile, for it must not come back as a second primary. Only with no follower alive, or
             * after a minute, is it restarted and promoted itself. */
            if (s_followers_alive(r, b) && now - b->down_ms < 60 * 1000) {
                b->failover_retry_ms = now + 1000;
                return 0;
            }
            b->promote_when_up = true;
            LOG_WARN("shard %d: no follower could be promoted; %s restarts and is promoted once it listens",
                     b->index, b->what);
        }
        b->failover_retry_ms = 0;
    }
    b->restarts++;
    r->bank_restarts++;
    const char *primary = s_primary_of(r, b);
    LOG_WARN("%s %s; restarting (%d/%d) on %s with its data in %s%s%s", b->what, how, b->restarts, max, b->endpoint,
             b->dir, primary ? " as a follower of " : "", primary ? primary : "");
    const pid_t dead_pid = b->proc.started_pid;
    char note[64];
    carls_fmt(note, sizeof note, "died: restarted (%d/%d)", b->restarts, max);
    char started[64];
    carls_fmt(started, sizeof started, "restart %d/%d%s", b->restarts, max, primary ? " as a follower" : "");
    if (s_restart(r, b, note, started) != 0) {
        return -1;
    }
    carls_run_event(r, "%s (pid %d) %s; restarted as pid %d (%d/%d)%s", b->what, (int)dead_pid, how,
                    (int)b->proc.started_pid, b->restarts, max, primary ? " as a follower" : "");
    return 0;
}

/* Server b restarted: once it has written its endpoint file, says so (and that clients reconnect), and
 * promotes it when its shard has no other primary; kills it when it is not listening by its deadline (the
 * next round restarts it again). */
static void s_bank_watch_restart(carls_run_t *r, carls_shard_t *b)
{
    char ep[256];
    carls_read_first_line(b->epfile, ep, sizeof ep); /* "" until the server has written it */
    if (*ep) {
        const double away = (double)(carls_monotonic_ms() - b->down_ms) / 1000.0;
        if (strcmp(ep, b->endpoint) != 0) {
            LOG_ERROR("the restarted %s listens on %s, not %s: clients cannot find it", b->what, ep, b->endpoint);
        }
        if (b->promote_when_up) {
            /* A member with its data comes back a standby; one that comes back a primary started on an empty
             * data directory (moved to another node): the shard's data is gone with its members. */
            carls_replica_status_t st;
            char err[600];
            if (carls_replica_call(r, b->endpoint, "status", 0, -1, &st, err, sizeof err) == 0 &&
                strcmp(st.role, "primary") == 0) {
                LOG_ERROR("shard %d lost every copy of its data: %s came back without it (an empty data directory, "
                          "another node) and no follower is left; stopping the run (see %s)", b->index, b->what,
                          b->log);
                carls_run_event(r, "shard %d lost every copy of its data: the run stops", b->index);
                r->bank_lost = true;
                return;
            }
            if (s_promote(r, b, "restarted after its shard lost every member") != 0) {
                carls_proc_kill(&b->proc); /* the next round restarts it and tries again */
                b->wait_deadline = 0;
                return;
            }
            b->promote_when_up = false;
            r->bank_failovers++;
            carls_run_event(r, "shard %d: %s promoted again (term %llu) after it restarted", b->index, b->what,
                            (unsigned long long)r->set[b->index].term);
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
        carls_proc_kill(&b->proc);
        b->wait_deadline = 0;
    }
}

/* --resume of a replicated bank: member 0 of each shard is restored from the snapshot and starts a new history
 * as primary in term 1 (its old REPLICATION file goes: the snapshot replaces its data); the other members
 * start empty and catch up from it by snapshot. */
static void s_prepare_replicated_restore(carls_run_t *r)
{
    for (int i = 0; i < r->n_members; i++) {
        carls_shard_t *b = &r->shard[i];
        char path[4400];
        if (b->member == 0) {
            carls_fmt(path, sizeof path, "%s/REPLICATION", b->dir);
            unlink(path);
        } else {
            char cmd[4500];
            carls_fmt(cmd, sizeof cmd, "rm -rf '%s'", b->dir);
            if (strchr(b->dir, '\'') || system(cmd) != 0) {
                LOG_WARN("cannot clear %s: %s catches up from what it holds", b->dir, b->what);
            }
        }
    }
}

/* Waits until server b has written its endpoint file (up to 30 s). Returns 0, or -1 when it did not. */
static int s_wait_listening(carls_shard_t *b)
{
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
    return 0;
}

/* The endpoint list every client gets: the shards in order, ',' between them, a shard's members (its primary
 * first) joined by '|'. Returns 0, or -1 when it does not fit one argument. */
static int s_endpoint_list(carls_run_t *r)
{
    r->endpoints[0] = '\0';
    size_t used = 0;
    for (int i = 0; i < r->n_members; i++) {
        const carls_shard_t *b = &r->shard[i];
        const char *sep = i == 0 ? "" : b->member ? "|" : ",";
        if (used + strlen(b->endpoint) + 2 > sizeof b->argv.arg[0] || used + strlen(b->endpoint) + 2 > sizeof r->endpoints) {
            LOG_ERROR("the shards' endpoint list is too long for one argument at %s (%s)", b->name, b->endpoint);
            return -1;
        }
        used += (size_t)snprintf(r->endpoints + used, sizeof r->endpoints - used, "%s%s", sep, b->endpoint);
    }
    return 0;
}

int carls_shards_start(carls_run_t *r, const char *restore)
{
    const carls_config_t *c = r->c;
    if (restore && r->replicas > 1) {
        s_prepare_replicated_restore(r);
    }
    /* Primaries (member 0) first: a follower is told its primary's endpoint. */
    for (int pass = 0; pass < (r->replicas > 1 ? 2 : 1); pass++) {
        for (int i = 0; i < r->n_members; i++) {
            carls_shard_t *b = &r->shard[i];
            if ((b->member == 0) != (pass == 0)) {
                continue;
            }
            b->endpoint[0] = '\0';
            unlink(b->epfile); /* a killed run's: not this server's */
            s_server_args(&b->argv, r, b);
            /* --restore only for this start (and only member 0): a restart later must not go back to it. */
            carls_argv_t *first = &b->argv, *with = NULL;
            if (restore && b->member == 0) {
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
            b->row = carls_ptab_started(&r->ptab, "kb-server", &b->proc,
                                        restore && b->member == 0 ? "--restore" : b->member ? "follower" : NULL);
        }
        for (int i = 0; i < r->n_members; i++) {
            carls_shard_t *b = &r->shard[i];
            if ((b->member == 0) == (pass == 0) && s_wait_listening(b) != 0) {
                return -1;
            }
        }
    }
    if (s_endpoint_list(r) != 0) {
        return -1;
    }
    for (int i = 0; r->replicas > 1 && i < r->n_shards; i++) {
        const carls_shard_t *p = &r->shard[i * r->replicas];
        carls_replica_record(r, i, r->set[i].term, 0, p->endpoint, r->set[i].k_now, restore ? "resumed" : "started");
    }
    if (r->n_members == 1) {
        printf("[carls] kb-server listening on %s", r->endpoints);
    } else if (r->replicas == 1) {
        printf("[carls] bank of %d shards (kb-server --shard I/%d) listening on %s", r->n_shards, r->n_shards,
               r->endpoints);
    } else {
        printf("[carls] bank of %d shard%s, each a primary and %d follower%s (min_replicas %d), listening on %s",
               r->n_shards, r->n_shards == 1 ? "" : "s", r->replicas - 1, r->replicas == 2 ? "" : "s",
               (int)c->min_replicas, r->endpoints);
    }
    printf("%s (each restarted on the same endpoint and data if it dies, up to %d times%s)\n",
           r->curve ? ", CURVE only" : "", (int)c->max_bank_restarts,
           r->replicas > 1 ? "; a dead primary's follower is promoted first" : "");
    return 0;
}

const char *carls_shards_words(const carls_run_t *r, char *buf, size_t len)
{
    char reps[64] = "";
    if (r->replicas > 1) {
        carls_fmt(reps, sizeof reps, " of %d members each (a primary and %d follower%s)", r->replicas, r->replicas - 1,
                  r->replicas == 2 ? "" : "s");
    }
    carls_fmt(buf, len, "%d kb-server%s%s%s", r->n_shards, r->n_shards == 1 ? "" : "s (shards)", reps,
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
    for (int i = 0; i < r->n_members; i++) {
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

/* A replicated shard's snapshots are written by whichever member was its primary at the time: for --resume
 * they are all moved to member 0's directory, where the candidates are looked for and which is restored. */
static void s_gather_snapshots(carls_run_t *r)
{
    for (int i = 0; i < r->n_members; i++) {
        const carls_shard_t *b = &r->shard[i];
        char from[4400], to[4400];
        carls_fmt(from, sizeof from, "%s/snapshots", b->dir);
        carls_fmt(to, sizeof to, "%s/snapshots", r->shard[b->index * r->replicas].dir);
        DIR *d = b->member ? opendir(from) : NULL;
        if (d && carls_mkdir_p(to, 0755, NULL, 0) != 0) {
            LOG_WARN("cannot make %s: the snapshots in %s are not looked at", to, from);
            closedir(d);
            d = NULL;
        }
        for (struct dirent *e = d ? readdir(d) : NULL; e; e = readdir(d)) {
            char src[4700], dst[4700];
            carls_fmt(src, sizeof src, "%s/%s", from, e->d_name);
            carls_fmt(dst, sizeof dst, "%s/%s", to, e->d_name);
            if (e->d_name[0] != '.' && access(dst, F_OK) != 0 && rename(src, dst) != 0) {
                LOG_WARN("cannot move snapshot %s to %s: %s", src, dst, strerror(errno));
            }
        }
        if (d) {
            closedir(d);
        }
    }
}

int carls_shards_resume(carls_run_t *r)
{
    const int64_t t0 = carls_monotonic_ms();
    const char *dirs[CARLS_MAX_SHARDS];
    for (int i = 0; i < r->n_shards; i++) {
        dirs[i] = r->shard[i * r->replicas].dir;
    }
    s_gather_snapshots(r);
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

/* A replicated shard running with fewer followers counted than it asks for (after a failover): once enough
 * followers are connected and caught up (lag under a second), its primary is told the full K again. */
static void s_raise_min_replicas(carls_run_t *r, int shard)
{
    carls_replica_set_t *set = &r->set[shard];
    carls_shard_t *p = &r->shard[shard * r->replicas + set->primary];
    const int64_t now = carls_monotonic_ms();
    if (set->k_now >= set->k || now < set->next_check_ms || !p->proc.running || p->wait_deadline) {
        return;
    }
    set->next_check_ms = now + 1000;
    carls_replica_status_t st;
    char err[600];
    if (carls_replica_call(r, p->endpoint, "status", 0, -1, &st, err, sizeof err) != 0) {
        LOG_WARN("shard %d: %s", shard, err);
        return;
    }
    if (st.followers_caught_up < set->k) {
        return;
    }
    if (carls_replica_call(r, p->endpoint, "set", 0, set->k, &st, err, sizeof err) != 0) {
        LOG_WARN("shard %d: %s", shard, err);
        return;
    }
    set->k_now = set->k;
    carls_replica_record(r, shard, set->term, set->primary, p->endpoint, set->k, "min_replicas restored");
    printf("[carls] shard %d: min_replicas back to %d (%d follower%s caught up)\n", shard, set->k,
           st.followers_caught_up, st.followers_caught_up == 1 ? "" : "s");
    fflush(stdout);
    carls_run_event(r, "shard %d: min_replicas back to %d once %d follower%s caught up", shard, set->k,
                    st.followers_caught_up, st.followers_caught_up == 1 ? "" : "s");
}

/* The watch on a replicated shard's primary: a status probe each second; one that misses CARLS_PROBES_MISSED
 * in a row (a process stopped or stuck, a machine that stopped answering) is killed, and its death starts the
 * failover like any other (a dead process answers nothing and is reaped at once). */
static void s_watch_primary(carls_run_t *r, int shard)
{
    carls_replica_set_t *set = &r->set[shard];
    carls_shard_t *p = &r->shard[shard * r->replicas + set->primary];
    const int64_t now = carls_monotonic_ms();
    if (!p->proc.running || p->wait_deadline || !*p->endpoint) {
        carls_replica_probe_stop(&set->probe);
        set->probes_missed = 0;
        return;
    }
    if (set->probe.pid) {
        const int answered = carls_replica_probe_poll(&set->probe, CARLS_PROBE_TIMEOUT_MS);
        if (answered == 0) {
            return;
        }
        set->probes_missed = answered > 0 ? 0 : set->probes_missed + 1;
        if (set->probes_missed >= CARLS_PROBES_MISSED) {
            LOG_WARN("%s (primary of shard %d, pid %d) did not answer %d status probes in a row: taking it for hung "
                     "and killing it, so that a follower takes over", p->what, shard, (int)p->proc.pid,
                     set->probes_missed);
            carls_run_event(r, "%s (primary of shard %d, pid %d) did not answer %d status probes: killed as hung",
                            p->what, shard, (int)p->proc.pid, set->probes_missed);
            carls_proc_kill(&p->proc);
            set->probes_missed = 0;
            return;
        }
    }
    if (now >= set->next_probe_ms && carls_replica_probe_start(r, p->endpoint, &set->probe) == 0) {
        set->next_probe_ms = now + 1000;
    }
}

int carls_shards_supervise(carls_run_t *r)
{
    for (int i = 0; r->replicas > 1 && i < r->n_shards; i++) {
        s_raise_min_replicas(r, i);
        s_watch_primary(r, i);
    }
    for (int i = 0; i < r->n_members; i++) {
        carls_shard_t *b = &r->shard[i];
        if (b->proc.running && carls_proc_poll(&b->proc) && s_bank_died(r, b) != 0) {
            return -1;
        }
        if (!b->proc.running && b->failover_retry_ms && carls_monotonic_ms() >= b->failover_retry_ms &&
            s_bank_died(r, b) != 0) {
            return -1; /* a dead primary whose followers did not answer yet: try them again */
        }
        if (r->bank_lost) {
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
    for (int i = 0; r->replicas > 1 && i < r->n_shards; i++) {
        carls_replica_probe_stop(&r->set[i].probe);
    }
    for (int i = 0; i < r->n_members; i++) {
        carls_shard_t *b = &r->shard[i];
        if (b->proc.running && carls_proc_poll(&b->proc)) {
            char how[96];
            LOG_WARN("%s %s before the launcher stopped it", b->what, carls_proc_describe(&b->proc, how, sizeof how));
            carls_ptab_ended(&r->ptab, b->row, &b->proc, "died: the run was ending");
        } else if (b->proc.running) {
            kill(b->proc.pid, SIGTERM); /* every shard checkpoints at once */
        }
    }
    for (int i = 0; i < r->n_members; i++) {
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
