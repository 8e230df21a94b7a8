/* A replicated shard (replicas = N) as the launcher, its one coordinator, sees it: `kbctl replica` run on the
 * launcher's machine against one member (the launcher links no ZeroMQ: docs/DESIGN.md) and what it answered,
 * and RUN/replication.tsv, the record of every term given. The decisions (who is promoted, when K goes back
 * up) are carls_shards.c's. */
#ifndef CARLS_REPLICAS_H
#define CARLS_REPLICAS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct carls_run carls_run_t;

/* The launcher's own client key of the run (keys/clients/launcher.key) with curve = on and replicas > 1. */
#define CARLS_LAUNCHER_KEY_STEM "launcher"

/* What one member said of itself (`kbctl replica ACTION`'s "key: value" lines). */
typedef struct {
    char role[16];             /* primary, follower, standby or deposed */
    uint64_t last_term;        /* the term of its newest record */
    uint64_t committed_epoch;  /* its newest record's epoch */
    int followers_caught_up;   /* a primary's followers connected now, with an acknowledged epoch and a lag
                                * under a second */
} carls_replica_status_t;

/* Runs `kbctl --kb ENDPOINT replica ACTION` (status, fence --term T, promote --term T --min-replicas K, set
 * --min-replicas K; term 0 and k < 0 leave those flags out) with a short timeout and no retries. Returns 0 with
 * *st filled, or -1 with kbctl's words (or why it did not answer) in err. */
int carls_replica_call(const carls_run_t *r, const char *endpoint, const char *action, uint64_t term, int k,
                       carls_replica_status_t *st, char *err, size_t errlen);

/* A `kbctl replica status` started and not waited for: the launcher's watch on a primary, which must not
 * hold up the supervision loop. */
typedef struct {
    pid_t pid;                 /* 0: none running */
    int64_t started_ms;
} carls_replica_probe_t;

/* Starts a status probe of endpoint (its output dropped). 0, or -1 when it could not start. */
int carls_replica_probe_start(const carls_run_t *r, const char *endpoint, carls_replica_probe_t *p);

/* 1: the member answered; 0: the probe still runs (for less than timeout_ms); -1: it failed or ran out of
 * time (then it is killed). */
int carls_replica_probe_poll(carls_replica_probe_t *p, int timeout_ms);

/* Stops a probe still running (the run is ending). */
void carls_replica_probe_stop(carls_replica_probe_t *p);

/* Appends a line to RUN/replication.tsv (header written first): when, shard, term, primary member, its
 * endpoint, K, and why; flushed and fsynced (a record for people: --resume starts a new history and does not
 * read it back). */
void carls_replica_record(const carls_run_t *r, int shard, uint64_t term, int member, const char *endpoint, int k,
                          const char *why);

#endif
