/* kb-bench internals: the shared pieces of the benchmark program (bench_main.c).
 *
 *   bench_util.c  options, clocks, the timed multi-thread runner and its latency percentiles, results
 *                 (table for people, one JSON object per line for scripts), child processes (kb-server,
 *                 redis-server), free loopback ports, data directories.
 *   bench_ref.c   the reference points measured in the same run: a raw ZeroMQ DEALER/ROUTER echo of given
 *                 request/reply sizes, Redis (MGET, pipelined SET, the latter also with appendfsync always;
 *                 through hiredis), and FAISS in-process (knn/kb_knn.h, the index code the server uses).
 *   bench_kb.c    the kb-server workloads: lookup, push, put, knn, mixed, sharded lookups.
 *
 * Keys are "k" + 9 decimal digits of the key index (bench_key), the same bytes for kb and Redis; values are
 * dim float32s from a seeded generator. Every case runs for a fixed time after a short warm-up; throughput
 * is units (embeddings, rows, queries) per second of that window, latency is per request (one batch). */
#ifndef KB_BENCH_H
#define KB_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ---- options ---- */

typedef struct {
    uint32_t dim;          /* embedding dimension */
    uint32_t batch;        /* keys per lookup / rows per push or put */
    uint32_t keys;         /* rows in the lookup/push/put table */
    uint32_t clients;      /* client threads per case */
    double seconds;        /* measured time per case */
    double warmup;         /* seconds before measuring */
    double mixed_seconds;  /* the mixed-load case */
    uint32_t mixed_makers; /* makers (put loops) beside the trainers in the mixed load (1) */
    uint32_t knn_batch;    /* queries per knn request */
    uint32_t knn_k;        /* neighbours per query */
    uint32_t knn_rows[4];  /* table sizes for the knn cases (0-terminated) */
    const char *knn_specs; /* comma list of flat, ivf, hnsw; NULL = all */
    uint32_t shard_counts[4];  /* shard scaling (0-terminated) */
    uint32_t row_counts[5];    /* row-count scaling (0-terminated) */
    uint32_t server_threads;   /* kb-server --threads */
    uint32_t knn_threads;      /* kb-server --knn-threads, and the in-process FAISS reference */
    const char *interval;      /* durability of the interval-mode server, e.g. "interval:1000" */
    const char *cases;         /* comma list of case groups to run, NULL = all */
    const char *kb_server;     /* path of kb-server */
    const char *redis_server;  /* path of redis-server ("" disables Redis) */
    const char *connect;       /* NULL: start servers; else endpoints of running servers (shard order) */
    const char *data_dir;      /* where started servers keep their data; NULL: a fresh directory in /tmp */
    bool keep_data;
    bool json;
    bool verbose;
    uint32_t repeat;           /* rounds of every case; each figure is reported as the round with the median
                                * ratio (or value), with the spread over the rounds */
    const char *mode;          /* "quick", "smoke", "full" or "custom": printed with the results */
    bool guard;                /* --guard: exit 1 when a figure with a target is below a third of it */
    const char *server_flags[8]; /* --server-flag: more kb-server arguments, for every server started */
    int n_server_flags;
} bench_opts_t;

/* Whether case group `name` (lookup, push, put, knn, mixed, shards, rows) is selected by opts->cases. */
bool bench_selected(const bench_opts_t *opts, const char *name);

/* The --cases list item at *p (len bytes, up to the next ',' or the end), moving *p past it: true while there
 * is one. */
bool bench_case_next(const char **p, const char **item, size_t *len);

/* ---- clocks and random numbers ---- */

double bench_now(void); /* monotonic seconds */
uint64_t bench_rand(uint64_t *state);
/* Uniform in [0, n). */
uint32_t bench_rand_below(uint64_t *state, uint32_t n);
/* Standard normal (Box-Muller). */
float bench_normal(uint64_t *state);
/* The key of index i: "k" + 9 digits, written to buf (at least 16 bytes); returns its length (10). */
size_t bench_key(uint32_t i, char *buf);
/* Deterministic value of key i: dim floats. */
void bench_value(uint32_t i, uint32_t dim, float *out);
/* The 1-minute load average, or -1. */
double bench_load1(void);

/* ---- the timed runner ---- */

/* One worker thread's operation: does one request and adds the units it moved (embeddings, rows,
 * queries) to *units. Returns 0, or -1 on failure (with a message in err), which ends the case. */
typedef int (*bench_op_fn)(void *thread_state, uint64_t *rng, uint64_t *units, char *err, size_t errlen);

typedef struct {
    void *(*thread_new)(void *arg, uint32_t thread_index); /* per-thread state (client, buffers); NULL fails */
    void (*thread_free)(void *thread_state);
    bench_op_fn op;
    void *arg;
} bench_workload_t;

typedef struct {
    double seconds;       /* the measured window (longer than asked when stretched) */
    bool stretched;       /* no request completed in the window asked for: it ended at the first that did */
    uint64_t ops;         /* requests completed in it */
    uint64_t units;       /* units moved in it */
    double rate;          /* units per second */
    double op_rate;       /* requests per second */
    double p50_us, p99_us, mean_us; /* per-request latency */
    bool failed;
    char error[256];
} bench_measure_t;

/* Runs the workload on `threads` threads: each runs its op for warmup seconds, then all measure for
 * seconds. A request counts when it completes in the window. When none completes in it (a machine too
 * loaded for a short window, as in --smoke), the window is stretched until the first one does (up to 30 s
 * more; from that request's start when it began before the window) and the rate is taken over the stretched
 * window, with a warning on stderr. Returns 0 (results in *out), or -1 when a thread failed or nothing
 * completed (out->error says why). */
int bench_run(const bench_workload_t *w, uint32_t threads, double warmup, double seconds, bench_measure_t *out);

/* ---- results ---- */

typedef struct {
    const char *name;        /* e.g. "lookup.throughput" */
    double value;
    const char *unit;        /* "emb/s", "us", "rows/s", "queries/s" */
    const char *reference;   /* what it is compared with, e.g. "redis.mget" ("" for none) */
    double reference_value;  /* NAN when unavailable */
    bool lower_is_better;    /* latency: ratio = value / reference and "better" means below */
    const char *target;      /* the target text, e.g. "<= 1.5" (ratio), or NULL */
    double target_ratio;     /* the bound the target sets on the ratio */
    double guard_level;      /* > 0: --guard's bound is a third of this measured ratio (three times it when lower
                              * is better) instead of the target's, for a figure that misses its target */
    double p50_us, p99_us;   /* per-request latency of the case (NAN when not measured) */
    uint32_t clients, batch, shards;
    uint64_t rows;
    const char *note;        /* short remark (why unavailable...), or NULL */
    double steal_pct;        /* set by bench_report: the share of CPU time the hypervisor gave to other guests
                              * since this case began (its bench_progress line), NAN where /proc/stat has none */
} bench_result_t;

/* A result of case `name` in unit, not measured yet: value and reference unavailable (NAN, ""), no latency,
 * the sizes of opts (clients, batch, keys as rows), one shard. */
bench_result_t bench_result(const bench_opts_t *opts, const char *name, const char *unit);
/* bench_result with its value, against reference, whose value is reference_value (NAN when unavailable). */
bench_result_t bench_result_vs(const bench_opts_t *opts, const char *name, const char *unit, double value,
                               const char *reference, double reference_value);
/* bench_result_vs of a measured case: m's rate as the value, and m's latency. */
bench_result_t bench_result_of(const bench_opts_t *opts, const char *name, const char *unit,
                               const bench_measure_t *m, const char *reference, double reference_value);
/* Prints one result (table row or JSON line) at once, and remembers it for the summary; with --repeat it is
 * kept instead, and bench_report_end prints each figure's median round. */
void bench_report(const bench_opts_t *opts, const bench_result_t *r);
/* Prints the table header (people) once. */
void bench_report_begin(const bench_opts_t *opts);
/* With --repeat, prints each figure's median round first; then the footer: load average, cores, elapsed
 * time, targets met/missed. */
void bench_report_end(const bench_opts_t *opts, double elapsed_s);
/* --guard: prints a line for each figure with a target whose ratio is unavailable or misses a third of
 * its bound (three times it, for figures where lower is better), and returns how many. A 5x slowdown of
 * any guarded figure that meets its target by less than 5/3 fails; noise, which moves ratios by tens of
 * percent, does not. A figure that misses its target is bounded by its guard_level instead, where it has
 * one, so that the bound does not fall inside its noise. Call after bench_report_end. */
int bench_guard_failures(void);
/* Number of results reported so far, and how many of them failed (value not finite). */
size_t bench_report_count(void);

/* Progress lines on stderr (people only; quiet with --json unless --verbose). */
void bench_progress(const bench_opts_t *opts, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- child processes ---- */

typedef struct {
    pid_t pid;
    char endpoint[256];  /* kb-server: tcp://127.0.0.1:PORT */
    char dir[512];       /* its data directory (removed by bench_server_stop unless keep) */
    char log[600];
    uint16_t port;       /* redis-server */
} bench_proc_t;

/* A fresh directory under opts->data_dir (or /tmp) for one server; 0 or -1. */
int bench_make_dir(const bench_opts_t *opts, const char *tag, char *out, size_t outlen);

/* Forks and execs argv (argv[0] a path) with stdout and stderr appended to the file log; the child dies
 * with the benchmark. Returns the pid, or -1. */
pid_t bench_spawn(const char *const *argv, const char *log);

/* Starts kb-server with its data in a fresh directory, on a free loopback port, with extra arguments
 * (NULL-terminated), and waits until it answers. 0 or -1 (logged). */
int bench_kb_start(const bench_opts_t *opts, const char *tag, const char *const *extra, bench_proc_t *out);

/* How a started redis-server persists: not at all (the MGET and SET references), or with `appendonly yes`
 * and `appendfsync always` (the reference for sync puts: Redis fsyncs its append-only file once per
 * event-loop turn, so a pipeline of SETs shares one fsync, as a kb put's rows share one group commit). */
typedef enum { BENCH_REDIS_NO_PERSISTENCE, BENCH_REDIS_AOF_ALWAYS } bench_redis_persistence_t;

/* Starts redis-server on a free loopback port with that persistence (its files in a fresh directory
 * under opts->data_dir) and waits for PING. -1 when Redis is missing or does not start (the caller reports
 * the reference as unavailable). */
int bench_redis_start(const bench_opts_t *opts, bench_redis_persistence_t persistence, bench_proc_t *out);

/* SIGTERM, wait (SIGKILL after 600 s), remove the data directory unless keep. Accepts pid 0. A child that
 * does not exit with status 0 is counted (bench_bad_exits) and logged. */
void bench_proc_stop(const bench_opts_t *opts, bench_proc_t *p);
int bench_bad_exits(void);

/* ---- references (bench_ref.c) ---- */

/* ZeroMQ echo over TCP loopback: a ROUTER thread answers every request_bytes message with reply_bytes.
 * clients DEALER threads, one message in flight each. Units: `units_per_op` per round trip. */
int bench_zmq_echo(const bench_opts_t *opts, size_t request_bytes, size_t reply_bytes, uint64_t units_per_op,
                   bench_measure_t *out);

/* Redis on port: loads opts->keys keys with dim*4-byte values (pipelined), then measures MGET of batch random
 * keys (units: keys) into *mget (skipped when mget is NULL) and pipelined SET of batch keys (units: rows)
 * into *set. */
int bench_redis(const bench_opts_t *opts, uint16_t port, bench_measure_t *mget, bench_measure_t *set);

/* In-process FAISS through kb_knn: an index of spec over rows (n x dim), queried by clients threads with
 * batches of opts->knn_batch queries drawn like the server case's. Units: queries. */
int bench_faiss(const bench_opts_t *opts, const char *spec, const float *rows, uint32_t n, bench_measure_t *out,
                double *build_s);

/* Query vectors for knn: a stored row plus small noise. */
void bench_knn_queries(const float *rows, uint32_t n, uint32_t dim, uint32_t nq, uint64_t *rng, float *out);

/* ---- kb workloads (bench_kb.c) ---- */

/* The requests bench_kb_measure sends, each to table "emb" (random keys of [0, keys)):
 *   LOOKUP      lookup of batch keys without counting uses (a trainer's neighbour fetch), units: rows
 *   PUSH        gradient push of batch rows, units: rows
 *   PUT         put of batch rows with a growing version, units: rows
 *   KNN_BY_KEY  knn of opts->knn_batch stored rows by key, each excluding itself, opts->knn_k neighbours
 *               (kb-maker's graph), units: queries
 *   SAMPLE      uniform sampling of batch rows (two-tower negatives), units: rows */
typedef enum { BENCH_KB_LOOKUP, BENCH_KB_PUSH, BENCH_KB_PUT, BENCH_KB_KNN_BY_KEY, BENCH_KB_SAMPLE } bench_kb_op_t;

/* Creates table "emb" of opts->dim on the server at endpoint (with a knn index of knn_spec, l2, or none when
 * NULL), puts n rows (rows, or bench_value when NULL), and waits until the index holds them. 0 or -1. */
int bench_kb_table(const bench_opts_t *opts, const char *endpoint, const char *knn_spec, uint32_t n,
                   const float *rows);

/* Runs op on opts->clients threads for opts->seconds after opts->warmup (bench_run). 0 or -1. */
int bench_kb_measure(const bench_opts_t *opts, const char *endpoint, bench_kb_op_t op, uint32_t keys,
                     uint32_t batch, bench_measure_t *m);

/* The server's own p50 of op (its latency stats), NAN when unknown. */
double bench_kb_server_p50(const char *endpoint, const char *op);

/* The experiments' request shapes against their floors (bench_workload.c): case group "workload", or the
 * shapes --cases names one by one (wl.word2vec.push...). */
void bench_workload_all(const bench_opts_t *opts, int *failures);

/* Whether --cases names the workload group or one of its shapes; whether name (len bytes) is a shape's. */
bool bench_workload_selected(const bench_opts_t *opts);
bool bench_workload_is_shape(const char *name, size_t len);

/* Runs every selected kb case and its references, reporting as it goes. Returns 0, or -1 when a kb case
 * failed (the failure is reported too). */
int bench_kb_all(const bench_opts_t *opts);

#endif
