/* The run in progress, shared by the launcher's modules (carls_run.c, carls_shards.c, carls_fleet.c,
 * carls_train.c) and by nothing else: its settings, files, processes and what happened to them, and the
 * helpers every phase uses (events, supervision, the clients' stems and bank arguments). */
#ifndef CARLS_RUN_INTERNAL_H
#define CARLS_RUN_INTERNAL_H

#include "carls_argv.h"
#include "carls_config.h"
#include "carls_ini.h"
#include "carls_proc.h"
#include "carls_ptab.h"
#include "carls_resume.h"
#include "carls_shards.h"
#include "carls_stages.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A run in progress: its configuration and files, its processes, their supervision and what happened to them. */
struct carls_run {
    const carls_config_t *c;
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
    /* The bank: n_shards shards of `replicas` kb-servers each (a primary and its followers), n_members in
     * all; shard i's member m is shard[i * replicas + m]. */
    int n_shards, replicas, n_members;
    carls_shard_t shard[CARLS_MAX_SHARDS * CARLS_MAX_REPLICAS];
    carls_replica_set_t set[CARLS_MAX_SHARDS]; /* replicas > 1: each shard's primary, term and K */
    char endpoints[CARLS_MAX_SHARDS * CARLS_MAX_REPLICAS * 257]; /* the shards' endpoints in shard order,
                                         * comma-separated, a replicated shard's members joined by '|': every
                                         * client's --kb */
    char replication_tsv[4300];       /* replicas > 1: RUN/replication.tsv, every term given (carls_replicas.h) */
    int bank_restarts;                /* restarts of any kb-server */
    int bank_failovers;               /* promotions of a follower after its primary died */
    double failover_worst_s;          /* the longest of them: primary found dead to follower promoted */
    bool bank_lost;                   /* a shard died with no restarts left: the run stops */
    /* curve = on: the run's keys (s_make_keys in carls_run.c). */
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
    carls_argv_t *fleet_argv;         /* (n_fleet) their arguments, for restarts */
    char fleet_log[CARLS_PROC_MAX][4400];
    int maker_deaths, maker_restarts; /* every maker (one-shot fleets included) */
    /* The trainer. */
    carls_proc_t trainer;
    int trainer_row;
    char snap_prefix[48];             /* its --bank-snapshot prefix (the run's name, carls_resume_prefix) */
    /* --resume RUN_DIR: where the run resumed (carls_shards_resume). */
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
};

/* Whether SIGINT or SIGTERM asked the run to stop. */
bool carls_run_interrupted(void);

/* Seconds since the run began. */
double carls_run_elapsed(const carls_run_t *r);

/* The stem of resident maker `task` number i ("maker-embed-0"). */
void carls_run_resident_stem(char *stem, size_t len, const char *task, int i);

/* The stem of one-shot fleet `label`'s maker number i ("pixels-1"). */
void carls_run_once_stem(char *stem, size_t len, const char *label, int i);

/* The key stem of member b of a replicated shard ("kb-server-0-m1"): its --replica-curve-key with curve = on. */
void carls_run_member_stem(char *stem, size_t len, const carls_shard_t *b);

/* The arguments every client of the bank gets: --kb with the shards' endpoints in shard order and, with
 * curve = on, its own secret key (keys/clients/STEM.key, made by s_make_keys in carls_run.c) and the servers' public key. */
void carls_run_bank_client_args(carls_argv_t *a, const carls_run_t *r, const char *stem);

/* With curve = on, the client key arguments alone (--curve-key keys/clients/STEM.key --curve-server-key ...):
 * for a client of one member (the launcher's kbctl calls). */
void carls_run_curve_client_args(carls_argv_t *a, const carls_run_t *r, const char *stem);

/* Appends a row to the report's fault table. */
void carls_run_event(carls_run_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* One round of supervision, called from every waiting loop: the bank's shards (each restarted when it died,
 * watched until it listens again) and the resident makers. Returns 0, or -1 when the bank is gone for good. */
int carls_run_supervise(carls_run_t *r);

#endif
