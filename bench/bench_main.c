/* kb-bench: measures kb-server against what users would pick instead, side by side in one run.
 * See `kb-bench --help` and docs/BENCHMARKS.md ("Knowledge bank"). */
#include "bench.h"

#include "protocol.h"
#include "files.h"

#include "carls_args.h"
#include "log.h"
#include "util.h"

#include <errno.h>
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
            "here: MGET, pipelined SET; pipelined SET with appendonly yes, appendfsync always for sync puts),\n"
            "and FAISS called in-process through the server's own index code. Figures with a target (issue 18)\n"
            "say whether it is met, and the table ends with the targets together.\n"
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
            "  --mixed-makers N       makers putting beside the trainers in the mixed load (1; 0: the\n"
            "                         trainers alone, to see what the makers cost them)\n"
            "  --knn-batch N          queries per knn request (16); --knn-k K neighbours (10)\n"
            "  --knn-rows LIST        knn table sizes, e.g. 100000,1000000 (mode)\n"
            "  --knn-specs LIST       which indexes: flat,ivf,hnsw (all)\n"
            "  --shards LIST          shard counts, e.g. 1,2,4\n"
            "  --rows LIST            row counts for the growth case, e.g. 10000,100000,1000000\n"
            "  --server-threads N     kb-server --threads (2); --knn-threads N (1, also in-process FAISS)\n"
            "  --interval MS          the interval durability to compare sync with (1000)\n"
            "  --cases LIST           case groups: lookup,push,put,knn,mixed,shards,rows (all), and, only when\n"
            "                         named, cache (--cache-bytes: lookup.cached, lookup.cold, cache.peak_rss)\n"
            "                         and workload (the experiments' requests: wl.graph.knn, wl.graph.neighbours,\n"
            "                         wl.graph.embed_put, wl.twotower.negatives, wl.twotower.hard,\n"
            "                         wl.word2vec.push, each against its floor in the same run; a case may\n"
            "                         also be named alone)\n"
            "  --server-flag ARG      one more argument for every kb-server started (repeat it, up to 8: e.g.\n"
            "                         --server-flag=--knn-slice-us --server-flag=0), to compare settings\n"
            "  --guard                exit 1 when a figure with a target is unavailable or below a third of\n"
            "                         its target, or of the level a case that misses its target is measured\n"
            "                         at (wl.word2vec.push) (CI: a 5x slowdown fails, noise does not)\n"
            "  --kb-server PATH       (default: kb-server beside kb-bench)\n"
            "  --redis-server PATH    (default /usr/bin/redis-server; 'none' skips Redis)\n"
            "  --connect ENDPOINT     use a running kb-server for lookup/push/put/mixed (creates table 'emb');\n"
            "                         knn, shards and rows need their own servers and are skipped\n"
            "  --data-dir DIR         where started servers keep their data (default: a new /tmp/kb-bench-*)\n"
            "  --keep-data            do not delete the data afterwards\n"
            "  --json                 one JSON object per line and result: case, value, unit, reference,\n"
            "                         reference_value, ratio, target, target_met, p50_us, p99_us, steal_pct\n"
            "                         (CPU steal since the case began: other guests on a virtual machine), ...\n"
            "  --verbose              progress on stderr also with --json\n"
            "  --repeat N             run every case N times (1); each figure is then the round with the median\n"
            "                         ratio to its reference (or median value), printed with the range over the\n"
            "                         rounds (JSON: rounds, ratio_min, ratio_max): on a loaded or small machine\n"
            "                         one round's ratio can fall on either side of a target\n"
            "  -h, --help\n"
            "\n"
            "Exit status: 0 when every kb case ran (references may be n/a), every server it started stopped\n"
            "cleanly and, with --guard, every guarded figure passed; 1 otherwise, 2 usage.\n");
}

/* --server-flag: one more kb-server argument (the text lives in argv). */
static int s_arg_server_flag(const char *prog, const char *name, const char *text, void *out)
{
    bench_opts_t *o = out;
    if (o->n_server_flags == (int)(sizeof o->server_flags / sizeof o->server_flags[0])) {
        fprintf(stderr, "%s: --%s: at most %zu of them\n", prog, name, sizeof o->server_flags / sizeof o->server_flags[0]);
        return -1;
    }
    o->server_flags[o->n_server_flags++] = text;
    return 0;
}

/* A comma list option's destination: at most cap - 1 values, then 0. */
typedef struct {
    uint32_t *values;
    int cap;
} s_list_t;

/* "a,b,c": 1 to cap - 1 integers >= 1 into the list (the rest zero). */
static int s_arg_list(const char *prog, const char *name, const char *text, void *out)
{
    const s_list_t *list = out;
    uint32_t values[8] = {0};
    int n = 0;
    char buf[256];
    bool ok = list->cap <= (int)(sizeof values / sizeof values[0]) &&
              (size_t)snprintf(buf, sizeof buf, "%s", text) < sizeof buf;
    for (char *save = NULL, *tok = ok ? strtok_r(buf, ",", &save) : NULL; tok; tok = strtok_r(NULL, ",", &save)) {
        uint64_t v;
        if (n == list->cap - 1 || carls_parse_u64(tok, &v) != 0 || v < 1 || v > UINT32_MAX) {
            ok = false;
            break;
        }
        values[n++] = (uint32_t)v;
    }
    if (!ok || n == 0) {
        fprintf(stderr, "%s: --%s: '%s' is not a list of 1 to %d integers >= 1\n", prog, name, text, list->cap - 1);
        return -1;
    }
    memcpy(list->values, values, (size_t)list->cap * sizeof *values);
    return 0;
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
    o->mixed_makers = 1;
    o->knn_batch = 16;
    o->knn_k = 10;
    o->server_threads = 2;
    o->knn_threads = 1;
    memcpy(o->knn_rows, m->knn_rows, sizeof o->knn_rows);
    memcpy(o->shard_counts, m->shard_counts, sizeof o->shard_counts);
    memcpy(o->row_counts, m->row_counts, sizeof o->row_counts);
}

/* Whether a and b have the same sizes and durations (what a mode sets, and --knn-specs). */
static bool s_same_sizes(const bench_opts_t *a, const bench_opts_t *b)
{
    return a->dim == b->dim && a->batch == b->batch && a->keys == b->keys && a->clients == b->clients &&
           a->seconds == b->seconds && a->warmup == b->warmup && a->mixed_seconds == b->mixed_seconds &&
           a->knn_batch == b->knn_batch && a->knn_k == b->knn_k && a->server_threads == b->server_threads &&
           a->knn_threads == b->knn_threads && a->knn_specs == b->knn_specs &&
           memcmp(a->knn_rows, b->knn_rows, sizeof a->knn_rows) == 0 &&
           memcmp(a->shard_counts, b->shard_counts, sizeof a->shard_counts) == 0 &&
           memcmp(a->row_counts, b->row_counts, sizeof a->row_counts) == 0;
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
    o->repeat = 1;
    o->kb_server = strings->kb_server;
    o->redis_server = access("/usr/bin/redis-server", X_OK) == 0 ? "/usr/bin/redis-server" : "";
    uint32_t interval_ms = 1000;
    const bench_opts_t mode_sizes = *o;
    bool mode_flag = false; /* --quick, --full, --smoke: applied above */
    s_list_t knn_rows = {o->knn_rows, 4}, shard_counts = {o->shard_counts, 4}, row_counts = {o->row_counts, 5};

    const carls_arg_t args[] = {
        carls_arg_set("quick", &mode_flag),
        carls_arg_set("full", &mode_flag),
        carls_arg_set("smoke", &mode_flag),
        carls_arg_u32("dim", &o->dim, 1, UINT32_MAX),
        carls_arg_u32("batch", &o->batch, 1, UINT32_MAX),
        carls_arg_u32("keys", &o->keys, 1, UINT32_MAX),
        carls_arg_u32("clients", &o->clients, 1, UINT32_MAX),
        carls_arg_double("seconds", &o->seconds, 0.05, 86400),
        carls_arg_double("warmup", &o->warmup, 0, 86400),
        carls_arg_double("mixed-seconds", &o->mixed_seconds, 0.05, 86400),
        carls_arg_u32("mixed-makers", &o->mixed_makers, 0, 64),
        carls_arg_u32("knn-batch", &o->knn_batch, 1, UINT32_MAX),
        carls_arg_u32("knn-k", &o->knn_k, 1, UINT32_MAX),
        carls_arg_custom("knn-rows", &knn_rows, s_arg_list),
        carls_arg_string("knn-specs", &o->knn_specs),
        carls_arg_custom("shards", &shard_counts, s_arg_list),
        carls_arg_custom("rows", &row_counts, s_arg_list),
        carls_arg_u32("server-threads", &o->server_threads, 1, UINT32_MAX),
        carls_arg_u32("knn-threads", &o->knn_threads, 1, UINT32_MAX),
        carls_arg_u32("interval", &interval_ms, 1, UINT32_MAX),
        carls_arg_string("cases", &o->cases),
        carls_arg_string("kb-server", &o->kb_server),
        carls_arg_string("redis-server", &o->redis_server),
        carls_arg_string("connect", &o->connect),
        carls_arg_string("data-dir", &o->data_dir),
        carls_arg_set("keep-data", &o->keep_data),
        carls_arg_set("json", &o->json),
        carls_arg_set("guard", &o->guard),
        {.name = "server-flag", .kind = CARLS_ARG_CUSTOM, .out = o, .parse = s_arg_server_flag},
        carls_arg_set("verbose", &o->verbose),
        carls_arg_u32("repeat", &o->repeat, 1, 100),
        {0},
    };
    int parsed = carls_args_parse("kb-bench", argc, argv, args, s_usage);
    if (parsed != 0) {
        return parsed > 0 ? 0 : 2; /* --help, or bad usage (reported) */
    }
    if (strcmp(o->redis_server, "none") == 0)
        o->redis_server = "";
    /* Sizes other than the mode's make the quick mode "custom" in the results. */
    if (strcmp(o->mode, "quick") == 0 && (!s_same_sizes(o, &mode_sizes) || interval_ms != 1000))
        o->mode = "custom";
    snprintf(strings->interval, sizeof strings->interval, "interval:%u", interval_ms);
    o->interval = strings->interval;
    return -1;
}

/* Refuses option values that fit no case. 0, or 2 (usage) after printing why. */
static int s_check_options(const bench_opts_t *o)
{
    static const char *const groups[] = {"lookup", "push", "put", "knn", "mixed", "shards", "rows", "cache",
                                         "workload"};
    const char *item;
    size_t len;
    for (const char *p = o->cases ? o->cases : ""; bench_case_next(&p, &item, &len);) {
        bool known = bench_workload_is_shape(item, len);
        for (size_t i = 0; !known && i < sizeof groups / sizeof groups[0]; i++)
            known = strlen(groups[i]) == len && strncmp(groups[i], item, len) == 0;
        if (!known) {
            fprintf(stderr, "kb-bench: --cases: '%.*s' is none of lookup, push, put, knn, mixed, shards, rows, "
                    "cache, workload and no workload case (kb-bench --help)\n", (int)len, item);
            return 2;
        }
    }
    for (int i = 0; i < 4 && o->shard_counts[i]; i++)
        if (o->shard_counts[i] > 8) {
            fprintf(stderr, "kb-bench: at most 8 shards\n");
            return 2;
        }
    if (o->batch > 100000 || o->knn_batch * o->dim > 16u << 20 || o->knn_k > CARLS_MAX_KNN_K) {
        fprintf(stderr, "kb-bench: --batch at most 100000, --knn-k at most %u\n", CARLS_MAX_KNN_K);
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
    } else {
        char err[512];
        if (carls_mkdir_p(o->data_dir, 0700, err, sizeof err) != 0) {
            fprintf(stderr, "kb-bench: --data-dir: %s\n", err);
            return 1;
        }
    }

    double t0 = bench_now();
    if (!o->json) {
        printf("kb-bench (%s): dim %u, batch %u, %u keys, %u clients, %.1f s per case, server threads %u, knn "
               "threads %u, %u round%s; %ld cores, load average %.2f at start\n\n",
               o->mode, o->dim, o->batch, o->keys, o->clients, o->seconds, o->server_threads, o->knn_threads,
               o->repeat, o->repeat == 1 ? "" : "s", sysconf(_SC_NPROCESSORS_ONLN), bench_load1());
    }
    bench_report_begin(o);
    int rc = 0;
    for (uint32_t round = 0; round < o->repeat; round++) {
        if (o->repeat > 1)
            bench_progress(o, "round %u of %u", round + 1, o->repeat);
        rc |= bench_kb_all(o);
    }
    bench_report_end(o, bench_now() - t0);
    if (o->guard && bench_guard_failures() > 0)
        rc = -1;
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
