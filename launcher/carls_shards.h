/* The bank of a run: its shards' kb-servers, each with its arguments, data directory, endpoint and log;
 * started (phase 1) or restored from a snapshot (--resume), supervised (a shard that dies is restarted on the
 * same endpoint and data, within max_bank_restarts) and stopped. */
#ifndef CARLS_SHARDS_H
#define CARLS_SHARDS_H

#include "carls_argv.h"
#include "carls_proc.h"
#include "carls_replicas.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct carls_run carls_run_t;

/* One kb-server of the bank: a shard's only server, or one member of a replicated shard (replicas = N), with
 * its files and supervision. */
typedef struct {
    int index;                        /* shard index of n_shards */
    int member;                       /* its member number in the shard, 0..replicas-1 (0 with replicas = 1) */
    char name[32];                    /* "kb-server I/N" or "kb-server I/N member M": its process name
                                       * (processes.tsv; Slurm places members of a shard on different nodes) */
    char what[32];                    /* in messages: "kb-server" (one shard) or its name */
    carls_proc_t proc;
    int row;                          /* its processes.tsv row */
    carls_argv_t argv;                /* its arguments (s_server_args, built again for each restart) */
    char dir[4300];                   /* its data: runs/<name>/kb (one shard) or kb-I */
    char epfile[4300];                /* where it writes its endpoint: kb.endpoint or kb-I.endpoint */
    char log[4400];                   /* logs/kb-server-I.log */
    char endpoint[256];               /* where it listens (the same after every restart) */
    int64_t down_ms;                  /* monotonic time it was found dead; 0 while it is up */
    int64_t wait_deadline;            /* a restarted server must be listening by then; 0: not waiting */
    int restarts;                     /* of this server (each has max_bank_restarts) */
    bool promote_when_up;             /* restarted standby of a shard with no live follower: promote it once it
                                       * listens (carls_replicas.h) */
    int64_t failover_retry_ms;        /* dead primary whose followers did not answer yet: when to ask again */
} carls_shard_t;

/* A replicated shard (replicas > 1): who its primary is, in which term, and the K it runs with. */
typedef struct {
    int primary;                      /* the member that is primary (0 at start) */
    uint64_t term;                    /* the primary's term: 1 at start, one more at each promotion */
    int k;                            /* min_replicas the run asks for */
    int k_now;                        /* what the primary was told: less than k after a failover left too few
                                       * live followers, raised back once enough have caught up */
    int64_t next_check_ms;            /* k_now < k: when to ask the primary again */
    carls_replica_probe_t probe;      /* the watch on the primary: one status probe a second */
    int64_t next_probe_ms;
    int probes_missed;                /* in a row; at CARLS_PROBES_MISSED the primary counts as hung */
} carls_replica_set_t;

/* Status probes of 3 s each a primary may miss in a row before the launcher takes it for hung (a stopped
 * process, a machine that stopped answering) and kills it, so that a follower takes over. */
#define CARLS_PROBES_MISSED 5
#define CARLS_PROBE_TIMEOUT_MS 3000

/* 1. The bank: n_shards kb-servers, each on a free loopback port; waits until every one listens, then
 * names the endpoint list every client gets. A restart (carls_shards_supervise) builds a shard's arguments
 * again, with --listen set to its bound endpoint. Returns 0 or -1. */
int carls_shards_start(carls_run_t *r, const char *restore);

/* The bank in words, for the stage table: "1 kb-server", "2 kb-servers (shards), CURVE (a key per process)". */
const char *carls_shards_words(const carls_run_t *r, char *buf, size_t len);

/* --resume, in place of phases 1 and 2: the bank restored (kb-server --restore) from the snapshot of the
 * newest checkpoint that has a complete one which every shard accepts (each checks the snapshot's files), and
 * the checkpoint directory rolled back to that checkpoint, so the makers and the trainer start from it. The
 * graph, pseudo-labels and neighbour embeddings (twotower: the rows it trains) are in the snapshot: no initial
 * graph. Returns 0, or -1 after saying what was wrong with each checkpoint. */
int carls_shards_resume(carls_run_t *r);


/* One round of the shards' supervision (carls_run_supervise): a shard that died is restarted with the same
 * flags, data directory and endpoint unless its max_bank_restarts are used up; a restarted one is watched until
 * it listens again. Returns 0, or -1 when the bank is gone for good (r->bank_lost). */
int carls_shards_supervise(carls_run_t *r);

/* 5. Stops the shards (after the makers): SIGTERM to every one at once (each checkpoints), then each waited
 * for; a shard found dead first is noted in processes.tsv. */
void carls_shards_stop(carls_run_t *r);

#endif
