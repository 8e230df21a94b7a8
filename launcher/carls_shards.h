/* The bank of a run: its shards' kb-servers, each with its arguments, data directory, endpoint and log;
 * started (phase 1) or restored from a snapshot (--resume), supervised (a shard that dies is restarted on the
 * same endpoint and data, within max_bank_restarts) and stopped. */
#ifndef CARLS_SHARDS_H
#define CARLS_SHARDS_H

#include "carls_argv.h"
#include "carls_proc.h"

#include <stddef.h>
#include <stdint.h>

typedef struct carls_run carls_run_t;

/* One shard of the bank: its kb-server, files and supervision. */
typedef struct {
    int index;                        /* shard index of n_shards */
    char name[32];                    /* "kb-server I/N": its process name (processes.tsv) */
    char what[32];                    /* in messages: "kb-server" (one shard) or its name */
    carls_proc_t proc;
    int row;                          /* its processes.tsv row */
    carls_argv_t argv;                /* its arguments; once it listens, --listen names the bound endpoint */
    int listen_arg;                   /* index of the --listen value in argv */
    char dir[4300];                   /* its data: runs/<name>/kb (one shard) or kb-I */
    char epfile[4300];                /* where it writes its endpoint: kb.endpoint or kb-I.endpoint */
    char log[4400];                   /* logs/kb-server-I.log */
    char endpoint[256];               /* where it listens (the same after every restart) */
    int64_t down_ms;                  /* monotonic time it was found dead; 0 while it is up */
    int64_t wait_deadline;            /* a restarted server must be listening by then; 0: not waiting */
    int restarts;                     /* of this shard (each shard has max_bank_restarts) */
} carls_shard_t;

/* 1. The bank: n_shards kb-servers, each on a free loopback port; waits until every one listens, then
 * names the endpoint list every client gets. A restart (carls_shards_supervise) reuses a shard's arguments with
 * --listen set to its bound endpoint. Returns 0 or -1. */
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
