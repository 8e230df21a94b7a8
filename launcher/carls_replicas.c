/* kbctl replica calls and replication.tsv (see carls_replicas.h). */
#include "carls_replicas.h"

#include "carls_run_internal.h"

#include "log.h"
#include "util.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* How long one kbctl call may take: a live member answers in milliseconds, and the supervision loop that
 * calls it waits meanwhile. */
#define S_CALL_TIMEOUT_MS 3000

/* The unsigned value after "key: " on a line of text, 0 when the key is not there. */
static uint64_t s_value(const char *text, const char *key)
{
    const size_t n = strlen(key);
    for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (strncmp(line, key, n) == 0 && line[n] == ':' && line[n + 1] == ' ') {
            return strtoull(line + n + 2, NULL, 10);
        }
    }
    return 0;
}

/* Parses kbctl's status lines into *st. Returns 0, or -1 when there is no "role:" line. */
static int s_parse(const char *text, carls_replica_status_t *st)
{
    memset(st, 0, sizeof *st);
    const char *role = strncmp(text, "role: ", 6) == 0 ? text : strstr(text, "\nrole: ");
    if (!role) {
        return -1;
    }
    role += role[0] == '\n' ? 7 : 6;
    const size_t len = strcspn(role, "\n");
    snprintf(st->role, sizeof st->role, "%.*s", (int)(len < sizeof st->role ? len : sizeof st->role - 1), role);
    st->last_term = s_value(text, "last_term");
    st->committed_epoch = s_value(text, "committed_epoch");
    /* "follower: MEMBER acked_epoch=N lag_ms=N live=yes|no" */
    for (const char *f = strstr(text, "\nfollower: "); f; f = strstr(f + 1, "\nfollower: ")) {
        const char *acked = strstr(f, " acked_epoch="), *lag = strstr(f, " lag_ms="), *live = strstr(f, " live=yes");
        const char *eol = strchr(f + 1, '\n');
        if (acked && lag && live && (!eol || live < eol) && strtoull(acked + 13, NULL, 10) > 0 &&
            strtoull(lag + 8, NULL, 10) < 1000) {
            st->followers_caught_up++;
        }
    }
    return 0;
}

/* `kbctl --kb ENDPOINT ... replica ACTION` (allocated), with the launcher's own key of the run with curve = on. */
static carls_argv_t *s_kbctl(const carls_run_t *r, const char *endpoint, const char *log_level, const char *action)
{
    carls_argv_t *a = carls_xcalloc(1, sizeof *a);
    carls_argv_add(a, "%s/kbctl", r->c->bin);
    carls_argv_add_list(a, (const char *const[]){"--kb", endpoint, "--timeout-ms", "2000", "--retries", "0",
                                                 "--log-level", log_level, NULL});
    carls_run_curve_client_args(a, r, CARLS_LAUNCHER_KEY_STEM);
    carls_argv_add_list(a, (const char *const[]){"replica", action, NULL});
    return a;
}

int carls_replica_call(const carls_run_t *r, const char *endpoint, const char *action, uint64_t term, int k,
                       carls_replica_status_t *st, char *err, size_t errlen)
{
    carls_argv_t *a = s_kbctl(r, endpoint, "error", action);
    if (term) {
        carls_argv_add(a, "--term");
        carls_argv_add(a, "%" PRIu64, term);
    }
    if (k >= 0) {
        carls_argv_add(a, "--min-replicas");
        carls_argv_add(a, "%d", k);
    }
    char out[8192];
    const int status = carls_proc_capture(a->ptr, out, sizeof out, S_CALL_TIMEOUT_MS);
    free(a);
    if (status == 0 && s_parse(out, st) == 0) {
        return 0;
    }
    out[strcspn(out, "\n")] = '\0'; /* kbctl's first line says why */
    snprintf(err, errlen, "kbctl replica %s at %s: %s", action, endpoint, *out ? out : "no answer");
    return -1;
}

int carls_replica_probe_start(const carls_run_t *r, const char *endpoint, carls_replica_probe_t *p)
{
    carls_argv_t *a = s_kbctl(r, endpoint, "off", "status");
    p->pid = carls_proc_spawn_local(a->ptr, -1);
    free(a);
    if (p->pid < 0) {
        p->pid = 0;
        return -1;
    }
    p->started_ms = carls_monotonic_ms();
    return 0;
}

int carls_replica_probe_poll(carls_replica_probe_t *p, int timeout_ms)
{
    if (!p->pid) {
        return -1;
    }
    int st = 0;
    const pid_t done = waitpid(p->pid, &st, WNOHANG);
    if (done == 0 && carls_monotonic_ms() - p->started_ms < timeout_ms) {
        return 0;
    }
    if (done == 0) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, &st, 0);
        p->pid = 0;
        return -1;
    }
    const bool answered = done > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
    p->pid = 0;
    return answered ? 1 : -1;
}

void carls_replica_probe_stop(carls_replica_probe_t *p)
{
    if (p->pid) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, NULL, 0);
        p->pid = 0;
    }
}

void carls_replica_record(const carls_run_t *r, int shard, uint64_t term, int member, const char *endpoint, int k,
                          const char *why)
{
    const bool fresh = access(r->replication_tsv, F_OK) != 0;
    FILE *f = fopen(r->replication_tsv, "a");
    if (!f) {
        LOG_WARN("cannot append to %s: shard %d term %llu (member %d) is not recorded", r->replication_tsv, shard,
                 (unsigned long long)term, member);
        return;
    }
    if (fresh) {
        fprintf(f, "elapsed_s\tshard\tterm\tprimary\tendpoint\tmin_replicas\twhy\n");
    }
    fprintf(f, "%.1f\t%d\t%" PRIu64 "\t%d\t%s\t%d\t%s\n", carls_run_elapsed(r), shard, term, member, endpoint, k, why);
    fflush(f);
    fsync(fileno(f));
    fclose(f);
}
