/* kb-bench: measures kb-server against what users would pick instead, side by side in one run.
 * See `kb-bench --help` and docs/BENCHMARKS.md ("Knowledge bank"). */
#include "bench.h"

#include "log.h"
#include "util.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void s_usage(FILE *out)
{
    fprintf(out,
            "usage: kb-bench [--quick | --full | --smoke] [options]\n"
            "\n"
            "Starts kb-server processes on loopback (or uses --connect) and measures lookups, gradient pushes,\n"
            "puts (sync and interval durability), knn (Flat, IVF, HNSW), a mixed load, shard and row-count\n"
            "scaling. Each figure is printed with a reference measured in the same run on the same payloads\n"
            "and their ratio: a raw ZeroMQ DEALER/ROUTER echo of the same bytes, Redis (redis-server started\n"
            "here: MGET, pipelined SET), and FAISS called in-process through the server's own index code.\n"
            "\n"
            "modes (sizes; later options override them):\n"
            "  --quick                20k keys, 1 s per case, knn at 10k rows (default; under two minutes)\n"
            "  --full                 100k keys, 5 s per case, knn at 100k and 1M rows, rows up to 1M\n"
            "                         (about 30 minutes and several GiB of memory)\n"
            "  --smoke                tiny sizes, for the CTest smoke test\n"
            "options:\n"
            "  --dim N                embedding dimension (64)\n"
            "  --batch N              keys per lookup, rows per push/put (256)\n"
            "  --keys N               rows in the table (mode)\n"
            "  --clients N            client threads per case (2)\n"
            "  --seconds S            measured seconds per case (mode); --warmup S before it\n"
            "  --mixed-seconds S      the mixed load's duration (mode)\n"
            "  --knn-batch N          queries per knn request (16); --knn-k K neighbours (10)\n"
            "  --knn-rows LIST        knn table sizes, e.g. 100000,1000000 (mode)\n"
            "  --knn-specs LIST       which indexes: flat,ivf,hnsw (all)\n"
            "  --shards LIST          shard counts, e.g. 1,2,4\n"
            "  --rows LIST            row counts for the growth case, e.g. 10000,100000,1000000\n"
            "  --server-threads N     kb-server --threads (2); --knn-threads N (1, also in-process FAISS)\n"
            "  --interval MS          the interval durability to compare sync with (1000)\n"
            "  --cases LIST           case groups: lookup,push,put,knn,mixed,shards,rows (all)\n"
            "  --kb-server PATH       (default: kb-server beside kb-bench)\n"
            "  --redis-server PATH    (default /usr/bin/redis-server; 'none' skips Redis)\n"
            "  --connect ENDPOINT     use a running kb-server for lookup/push/put/mixed (creates table 'emb');\n"
            "                         knn, shards and rows need their own servers and are skipped\n"
            "  --data-dir DIR         where started servers keep their data (default: a new /tmp/kb-bench-*)\n"
            "  --keep-data            do not delete the data afterwards\n"
            "  --json                 one JSON object per line and result: case, value, unit, reference,\n"
            "                         reference_value, ratio, target, target_met, p50_us, p99_us, ...\n"
            "  --verbose              progress on stderr also with --json\n"
            "  -h, --help\n"
            "\n"
            "Exit status: 0 when every kb case ran (references may be n/a) and every server it started stopped\n"
            "cleanly, 1 otherwise, 2 usage.\n");
}

static int s_u32(const char *opt, const char *text, uint32_t min, uint32_t *out)
{
    uint64_t v;
    if (carls_parse_u64(text, &v) != 0 || v < min || v > UINT32_MAX) {
        fprintf(stderr, "kb-bench: %s needs an integer >= %u, got '%s'\n", opt, min, text);
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

static int s_seconds(const char *opt, const char *text, double min, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !(v >= min) || v > 86400) {
        fprintf(stderr, "kb-bench: %s needs seconds >= %g, got '%s'\n", opt, min, text);
        return -1;
    }
    *out = v;
    return 0;
}

/* "a,b,c" into at most cap values (the rest zero). */
static int s_list(const char *opt, const char *text, uint32_t *out, int cap)
{
    memset(out, 0, (size_t)cap * sizeof *out);
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", text);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == cap - 1 || s_u32(opt, tok, 1, &out[n]) != 0) {
            fprintf(stderr, "kb-bench: %s takes at most %d values >= 1\n", opt, cap - 1);
            return -1;
        }
        n++;
    }
    return n > 0 ? 0 : -1;
}

/* What a mode sets: its sizes and durations (every other default is the same in all modes). */
typedef struct {
    const char *name;
    uint32_t keys, batch;
    double seconds, warmup, mixed_seconds;
    uint32_t knn_rows[4], shard_counts[4], row_counts[5]; /* 0-terminated */
} s_mode_t;

static const s_mode_t s_modes[] = {
    {"quick", 20000, 256, 1.0, 0.3, 2.0, {10000}, {1, 2, 4}, {10000, 50000}},
    {"full", 100000, 256, 5.0, 1.0, 10.0, {100000, 1000000}, {1, 2, 4}, {10000, 100000, 1000000}},
    {"smoke", 2000, 64, 0.3, 0.1, 0.5, {2000}, {1, 2}, {1000, 3000}},
};

/* Sets every size option to mode m's. */
static void s_mode(bench_opts_t *o, const s_mode_t *m)
{
    o->mode = m->name;
    o->dim = 64;
    o->batch = m->batch;
    o->keys = m->keys;
    o->clients = 2;
    o->seconds = m->seconds;
    o->warmup = m->warmup;
    o->mixed_seconds = m->mixed_seconds;
    o->knn_batch = 16;
    o->knn_k = 10;
    o->server_threads = 2;
    o->knn_threads = 1;
    memcpy(o->knn_rows, m->knn_rows, sizeof o->knn_rows);
    memcpy(o->shard_counts, m->shard_counts, sizeof o->shard_counts);
    memcpy(o->row_counts, m->row_counts, sizeof o->row_counts);
}

/* kb-server beside this program (both are built into build/bin). */
static void s_default_server(char *out, size_t len)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = '\0';
            snprintf(out, len, "%s/kb-server", self);
            return;
        }
    }
    snprintf(out, len, "kb-server");
}

/* Storage for the strings bench_opts_t points to that main makes up. */
typedef struct {
    char kb_server[PATH_MAX + 16];
    char interval[32];
} s_strings_t;

/* Sets *o from the command line, over the sizes of its mode and the defaults. Returns -1 to go on, or the
 * exit status to return now (after printing why or the help). */
static int s_parse_options(int argc, char **argv, bench_opts_t *o, s_strings_t *strings)
{
    /* The mode first, so that other options override its sizes wherever they stand; --quick, s_modes[0],
     * is the default. */
    s_mode(o, &s_modes[0]);
    for (int i = 1; i < argc; i++)
        for (size_t m = 1; m < sizeof s_modes / sizeof s_modes[0]; m++)
            if (strncmp(argv[i], "--", 2) == 0 && strcmp(argv[i] + 2, s_modes[m].name) == 0)
                s_mode(o, &s_modes[m]);
    s_default_server(strings->kb_server, sizeof strings->kb_server);
    o->kb_server = strings->kb_server;
    o->redis_server = access("/usr/bin/redis-server", X_OK) == 0 ? "/usr/bin/redis-server" : "";
    uint32_t interval_ms = 1000;
    bool custom = false;

    enum { O_QUICK = 256, O_FULL, O_SMOKE, O_DIM, O_BATCH, O_KEYS, O_CLIENTS, O_SECONDS, O_WARMUP, O_MIXED,
           O_KNN_BATCH, O_KNN_K, O_KNN_ROWS, O_SHARDS, O_ROWS, O_SERVER_THREADS, O_KNN_THREADS, O_INTERVAL,
           O_CASES, O_KB_SERVER, O_REDIS, O_CONNECT, O_DATA, O_KEEP, O_JSON, O_VERBOSE, O_KNN_SPECS };
    static const struct option options[] = {
        {"quick", no_argument, NULL, O_QUICK},
        {"full", no_argument, NULL, O_FULL},
        {"smoke", no_argument, NULL, O_SMOKE},
        {"dim", required_argument, NULL, O_DIM},
        {"batch", required_argument, NULL, O_BATCH},
        {"keys", required_argument, NULL, O_KEYS},
        {"clients", required_argument, NULL, O_CLIENTS},
        {"seconds", required_argument, NULL, O_SECONDS},
        {"warmup", required_argument, NULL, O_WARMUP},
        {"mixed-seconds", required_argument, NULL, O_MIXED},
        {"knn-batch", required_argument, NULL, O_KNN_BATCH},
        {"knn-k", required_argument, NULL, O_KNN_K},
        {"knn-rows", required_argument, NULL, O_KNN_ROWS},
        {"knn-specs", required_argument, NULL, O_KNN_SPECS},
        {"shards", required_argument, NULL, O_SHARDS},
        {"rows", required_argument, NULL, O_ROWS},
        {"server-threads", required_argument, NULL, O_SERVER_THREADS},
        {"knn-threads", required_argument, NULL, O_KNN_THREADS},
        {"interval", required_argument, NULL, O_INTERVAL},
        {"cases", required_argument, NULL, O_CASES},
        {"kb-server", required_argument, NULL, O_KB_SERVER},
        {"redis-server", required_argument, NULL, O_REDIS},
        {"connect", required_argument, NULL, O_CONNECT},
        {"data-dir", required_argument, NULL, O_DATA},
        {"keep-data", no_argument, NULL, O_KEEP},
        {"json", no_argument, NULL, O_JSON},
        {"verbose", no_argument, NULL, O_VERBOSE},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c, bad = 0;
    while ((c = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (c) {
        case O_QUICK: case O_FULL: case O_SMOKE: break; /* applied above */
        case O_DIM: bad |= s_u32("--dim", optarg, 1, &o->dim); custom = true; break;
        case O_BATCH: bad |= s_u32("--batch", optarg, 1, &o->batch); custom = true; break;
        case O_KEYS: bad |= s_u32("--keys", optarg, 1, &o->keys); custom = true; break;
        case O_CLIENTS: bad |= s_u32("--clients", optarg, 1, &o->clients); custom = true; break;
        case O_SECONDS: bad |= s_seconds("--seconds", optarg, 0.05, &o->seconds); custom = true; break;
        case O_WARMUP: bad |= s_seconds("--warmup", optarg, 0, &o->warmup); custom = true; break;
        case O_MIXED: bad |= s_seconds("--mixed-seconds", optarg, 0.05, &o->mixed_seconds); custom = true; break;
        case O_KNN_BATCH: bad |= s_u32("--knn-batch", optarg, 1, &o->knn_batch); custom = true; break;
        case O_KNN_K: bad |= s_u32("--knn-k", optarg, 1, &o->knn_k); custom = true; break;
        case O_KNN_ROWS: bad |= s_list("--knn-rows", optarg, o->knn_rows, 4); custom = true; break;
        case O_SHARDS: bad |= s_list("--shards", optarg, o->shard_counts, 4); custom = true; break;
        case O_ROWS: bad |= s_list("--rows", optarg, o->row_counts, 5); custom = true; break;
        case O_SERVER_THREADS: bad |= s_u32("--server-threads", optarg, 1, &o->server_threads); custom = true; break;
        case O_KNN_THREADS: bad |= s_u32("--knn-threads", optarg, 1, &o->knn_threads); custom = true; break;
        case O_INTERVAL: bad |= s_u32("--interval", optarg, 1, &interval_ms); custom = true; break;
        case O_CASES: o->cases = optarg; break;
        case O_KNN_SPECS: o->knn_specs = optarg; custom = true; break;
        case O_KB_SERVER: o->kb_server = optarg; break;
        case O_REDIS: o->redis_server = strcmp(optarg, "none") == 0 ? "" : optarg; break;
        case O_CONNECT: o->connect = optarg; break;
        case O_DATA: o->data_dir = optarg; break;
        case O_KEEP: o->keep_data = true; break;
        case O_JSON: o->json = true; break;
        case O_VERBOSE: o->verbose = true; break;
        case 'h': s_usage(stdout); return 0;
        default: s_usage(stderr); return 2;
        }
    }
    if (bad || optind < argc) {
        if (optind < argc)
            fprintf(stderr, "kb-bench: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (custom)
        o->mode = strcmp(o->mode, "quick") == 0 ? "custom" : o->mode;
    snprintf(strings->interval, sizeof strings->interval, "interval:%u", interval_ms);
    o->interval = strings->interval;
    return -1;
}

/* Refuses option values that fit no case. 0, or 2 (usage) after printing why. */
static int s_check_options(const bench_opts_t *o)
{
    for (int i = 0; i < 4 && o->shard_counts[i]; i++)
        if (o->shard_counts[i] > 8) {
            fprintf(stderr, "kb-bench: at most 8 shards\n");
            return 2;
        }
    if (o->batch > 100000 || o->knn_batch * o->dim > 16u << 20 || o->knn_k > 4096) {
        fprintf(stderr, "kb-bench: --batch at most 100000, --knn-k at most 4096\n");
        return 2;
    }
    if (o->connect && strchr(o->connect, ',')) {
        fprintf(stderr, "kb-bench: --connect takes one endpoint (shard scaling starts its own servers)\n");
        return 2;
    }
    if (!o->connect && access(o->kb_server, X_OK) != 0) {
        fprintf(stderr, "kb-bench: no kb-server at %s (use --kb-server)\n", o->kb_server);
        return 2;
    }
    return 0;
}

/* Runs the selected cases and reports them, in a fresh data directory unless --data-dir names one. Exit
 * status: 0 when every case ran and every server stopped cleanly, 1 otherwise. */
static int s_run(bench_opts_t *o)
{
    char tmpdir[64] = "/tmp/kb-bench-XXXXXX";
    bool own_dir = false;
    if (!o->data_dir) {
        if (!mkdtemp(tmpdir)) {
            fprintf(stderr, "kb-bench: mkdtemp: %s\n", strerror(errno));
            return 1;
        }
        o->data_dir = tmpdir;
        own_dir = true;
    }

    double t0 = bench_now();
    if (!o->json) {
        printf("kb-bench (%s): dim %u, batch %u, %u keys, %u clients, %.1f s per case, server threads %u, knn "
               "threads %u; %ld cores, load average %.2f at start\n\n",
               o->mode, o->dim, o->batch, o->keys, o->clients, o->seconds, o->server_threads, o->knn_threads,
               sysconf(_SC_NPROCESSORS_ONLN), bench_load1());
    }
    bench_report_begin(o);
    int rc = bench_kb_all(o);
    bench_report_end(o, bench_now() - t0);
    if (own_dir && !o->keep_data)
        rmdir(tmpdir); /* the servers' directories are gone already */
    else if (o->keep_data)
        bench_progress(o, "data kept in %s", o->data_dir);
    if (bench_bad_exits() > 0) {
        fprintf(stderr, "kb-bench: %d server(s) did not exit cleanly\n", bench_bad_exits());
        rc = -1;
    }
    return rc == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    carls_log_init_from_env();
    if (!getenv("CARLS_LOG_LEVEL"))
        carls_log_set_level(CARLS_LOG_WARN);
    bench_opts_t o;
    memset(&o, 0, sizeof o);
    s_strings_t strings;
    int st = s_parse_options(argc, argv, &o, &strings);
    if (st >= 0)
        return st;
    st = s_check_options(&o);
    if (st != 0)
        return st;
    signal(SIGPIPE, SIG_IGN);
    return s_run(&o);
}
