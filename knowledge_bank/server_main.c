/* kb-server: the knowledge bank's server program. See `kb-server --help` and docs/PROTOCOL.md. */
#include "files.h"
#include "kb_bank.h"
#include "kb_metrics.h"
#include "kb_knn.h"
#include "kb_memory.h"
#include "kb_server.h"
#include "kb_service.h"
#include "log.h"
#include "protocol.h"
#include "util.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t s_stop = 0;

static void s_on_signal(int sig)
{
    (void)sig;
    s_stop = 1;
}

static void s_usage(FILE *out)
{
    fprintf(out,
            "usage: kb-server [options]\n"
            "\n"
            "The carls-c knowledge bank: string-keyed embedding tables with lazy-averaged gradient updates,\n"
            "server-side optimizers and SQLite persistence, served over ZeroMQ (protocol: docs/PROTOCOL.md).\n"
            "\n"
            "options:\n"
            "  --listen ENDPOINT          ZeroMQ endpoint to bind (default tcp://127.0.0.1:7070;\n"
            "                             tcp://127.0.0.1:* picks a free port, see --endpoint-file)\n"
            "  --data DIR                 data directory, created 0700 if missing (default ./kb-data)\n"
            "  --durability MODE          sync: a write is committed to disk before it is acknowledged\n"
            "                             (concurrent writes share commits); interval:MS: commit every MS ms,\n"
            "                             so up to MS ms of acknowledged writes can be lost in a crash\n"
            "                             (default sync)\n"
            "  --threads N                worker threads (default 2)\n"
            "  --knn-threads N            OpenMP threads per nearest-neighbour search (default 1; OpenBLAS\n"
            "                             stays at 1: their product must not oversubscribe the cores, and\n"
            "                             the worker threads already search in parallel)\n"
            "  --read-only                refuse every write (serving mode)\n"
            "  --shard I/N                this server is shard I of N (0-based): it refuses keys that belong\n"
            "                             to other shards (clients route keys with the same hash)\n"
            "  --max-message-bytes N      largest request frame (default %u)\n"
            "  --max-key-bytes N          longest key (default %u)\n"
            "  --max-dim N                largest table dimension (default %u)\n"
            "  --max-keys-per-request N   most keys in one request (default %u)\n"
            "  --commit-timeout-ms N      sync mode: answer INTERNAL if a commit takes longer (default 30000)\n"
            "  --max-memory BYTES         memory budget for the bank's data (suffixes K, M, G: powers of 1024;\n"
            "                             default unlimited). Once the server's estimate of its tables (rows,\n"
            "                             keys, optimizer state, pending gradients, feature records, indexes)\n"
            "                             would go over it, requests that create rows or tables are refused\n"
            "                             whole with RESOURCE_EXHAUSTED; reads and updates of existing rows go\n"
            "                             on. Dropped tables and evicted rows give budget back. The process's\n"
            "                             resident size is this plus its own overhead (docs/RELIABILITY.md)\n"
            "  --endpoint-file FILE       write the bound endpoint to FILE once listening\n"
            "  --metrics-port P           serve Prometheus metrics (what `stats` answers) over HTTP on\n"
            "                             http://ADDRESS:P/metrics (0: a free port, logged)\n"
            "  --metrics-address ADDR     IPv4 address for --metrics-port (default 127.0.0.1; no auth)\n"
            "  --curve-secret FILE        encrypt with CURVE using this server key (from kb-keygen) ...\n"
            "  --curve-allow PATH         ... and admit only these client public keys (a directory of\n"
            "                             *.pub files, or a file with one key per line); docs/SECURITY.md\n"
            "  --log-level LEVEL          debug, info, warn, error (default info; or CARLS_LOG_LEVEL)\n"
            "  -h, --help                 this help\n"
            "\n"
            "SIGINT or SIGTERM stops the server cleanly: requests in progress are answered and everything\n"
            "is committed before it exits.\n",
            CARLS_DEFAULT_MAX_MESSAGE_BYTES, CARLS_DEFAULT_MAX_KEY_BYTES, CARLS_DEFAULT_MAX_DIM,
            CARLS_DEFAULT_MAX_KEYS_PER_REQUEST);
}

/* Parses a positive 32-bit option value or exits with a message. */
static uint32_t s_parse_u32(const char *opt, const char *text, uint32_t min)
{
    uint64_t v;
    if (carls_parse_u64(text, &v) != 0 || v < min || v > UINT32_MAX) {
        fprintf(stderr, "kb-server: %s needs an integer >= %u, got '%s'\n", opt, min, text);
        exit(2);
    }
    return (uint32_t)v;
}

/* Writes text and a newline to path atomically (files.h) so a reader never sees half of it. -1 with errno. */
static int s_write_file(const char *path, const char *text)
{
    char line[1024];
    if ((size_t)snprintf(line, sizeof line, "%s\n", text) >= sizeof line) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return carls_write_file_atomic(path, line, strlen(line), 0666, 0, NULL, 0) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    carls_log_init_from_env();
    const char *listen = "tcp://127.0.0.1:7070";
    const char *data_dir = "./kb-data";
    const char *durability = "sync";
    const char *endpoint_file = NULL;
    const char *curve_secret = NULL, *curve_allow = NULL;
    uint32_t threads = 2;
    uint32_t knn_threads = 1;
    int metrics_port = -1; /* -1: no metrics server */
    const char *metrics_address = "127.0.0.1";
    kb_limits_t limits;
    kb_limits_defaults(&limits);
    uint64_t max_memory = 0;

    enum { O_LISTEN = 256, O_DATA, O_DUR, O_THREADS, O_RO, O_MSG, O_KEY, O_DIM, O_KEYS, O_COMMIT, O_EPFILE, O_LOG,
           O_SHARD, O_CURVE_SECRET, O_CURVE_ALLOW, O_KNN_THREADS, O_METRICS_PORT, O_METRICS_ADDR, O_MAX_MEMORY };
    static const struct option options[] = {
        {"listen", required_argument, NULL, O_LISTEN},
        {"data", required_argument, NULL, O_DATA},
        {"durability", required_argument, NULL, O_DUR},
        {"threads", required_argument, NULL, O_THREADS},
        {"read-only", no_argument, NULL, O_RO},
        {"shard", required_argument, NULL, O_SHARD},
        {"knn-threads", required_argument, NULL, O_KNN_THREADS},
        {"metrics-port", required_argument, NULL, O_METRICS_PORT},
        {"metrics-address", required_argument, NULL, O_METRICS_ADDR},
        {"curve-secret", required_argument, NULL, O_CURVE_SECRET},
        {"curve-allow", required_argument, NULL, O_CURVE_ALLOW},
        {"max-message-bytes", required_argument, NULL, O_MSG},
        {"max-key-bytes", required_argument, NULL, O_KEY},
        {"max-dim", required_argument, NULL, O_DIM},
        {"max-keys-per-request", required_argument, NULL, O_KEYS},
        {"commit-timeout-ms", required_argument, NULL, O_COMMIT},
        {"max-memory", required_argument, NULL, O_MAX_MEMORY},
        {"endpoint-file", required_argument, NULL, O_EPFILE},
        {"log-level", required_argument, NULL, O_LOG},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (c) {
        case O_LISTEN: listen = optarg; break;
        case O_DATA: data_dir = optarg; break;
        case O_DUR: durability = optarg; break;
        case O_THREADS: threads = s_parse_u32("--threads", optarg, 1); break;
        case O_KNN_THREADS: knn_threads = s_parse_u32("--knn-threads", optarg, 1); break;
        case O_METRICS_PORT: {
            uint32_t p = s_parse_u32("--metrics-port", optarg, 0);
            if (p > 65535) {
                fprintf(stderr, "kb-server: --metrics-port must be 0..65535, got '%s'\n", optarg);
                return 2;
            }
            metrics_port = (int)p;
            break;
        }
        case O_METRICS_ADDR: metrics_address = optarg; break;
        case O_RO: limits.read_only = true; break;
        case O_SHARD: {
            unsigned i, n;
            char extra;
            if (sscanf(optarg, "%u/%u%c", &i, &n, &extra) != 2 || n == 0 || i >= n || n > 65536) {
                fprintf(stderr, "kb-server: --shard needs I/N with 0 <= I < N, got '%s'\n", optarg);
                return 2;
            }
            limits.shard_index = i;
            limits.shard_count = n;
            break;
        }
        case O_MSG: limits.max_message_bytes = s_parse_u32("--max-message-bytes", optarg, 1024); break;
        case O_KEY: limits.max_key_bytes = s_parse_u32("--max-key-bytes", optarg, 1); break;
        case O_DIM: limits.max_dim = s_parse_u32("--max-dim", optarg, 1); break;
        case O_KEYS: limits.max_keys_per_request = s_parse_u32("--max-keys-per-request", optarg, 1); break;
        case O_COMMIT: limits.commit_timeout_ms = (int)s_parse_u32("--commit-timeout-ms", optarg, 1); break;
        case O_MAX_MEMORY:
            if (kb_memory_parse(optarg, &max_memory) != 0) {
                fprintf(stderr, "kb-server: --max-memory needs a byte count such as 536870912, 512M or 4G "
                                "(or 'unlimited'), got '%s'\n", optarg);
                return 2;
            }
            break;
        case O_EPFILE: endpoint_file = optarg; break;
        case O_CURVE_SECRET: curve_secret = optarg; break;
        case O_CURVE_ALLOW: curve_allow = optarg; break;
        case O_LOG:
            if (carls_log_level_option("kb-server", optarg) != 0)
                return 2;
            break;
        case 'h': s_usage(stdout); return 0;
        default: s_usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kb-server: unexpected argument '%s'\n", argv[optind]);
        s_usage(stderr);
        return 2;
    }
    if (!curve_secret != !curve_allow) {
        fprintf(stderr, "kb-server: --curve-secret and --curve-allow go together\n");
        return 2;
    }
    if (threads > 256) {
        fprintf(stderr, "kb-server: --threads must be at most 256\n");
        return 2;
    }

    kb_bank_options_t bank_opts = {.data_dir = data_dir, .max_memory = max_memory};
    if (strcmp(durability, "sync") == 0) {
        bank_opts.sync = true;
    } else if (strncmp(durability, "interval:", 9) == 0) {
        bank_opts.interval_ms = s_parse_u32("--durability interval:", durability + 9, 1);
    } else {
        fprintf(stderr, "kb-server: --durability must be sync or interval:MS, got '%s'\n", durability);
        return 2;
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    kb_knn_set_threads((int)knn_threads, 1);
    char err[1024];
    kb_bank_t *bank = NULL;
    if (kb_bank_open(&bank_opts, &bank, err, sizeof err) != 0) {
        LOG_ERROR("cannot open the bank: %s", err);
        return 1;
    }
    kb_service_t *service = kb_service_new(bank, &limits, threads, durability);
    kb_server_options_t server_opts = {
        .endpoint = listen,
        .threads = threads,
        .max_message_bytes = limits.max_message_bytes,
        .curve_secret_file = curve_secret,
        .curve_allow_path = curve_allow,
    };
    kb_server_t *server = NULL;
    kb_metrics_server_t *metrics = NULL;
    int rc = 0;
    if (kb_server_new(service, &server_opts, &server, err, sizeof err) != 0) {
        LOG_ERROR("%s", err);
        rc = 1;
        goto done;
    }
    /* Before the endpoint file is written, so whoever waits for that file finds the metrics up too. */
    if (metrics_port >= 0) {
        if (kb_metrics_server_start(service, metrics_address, (uint16_t)metrics_port, &metrics, err, sizeof err) !=
            0) {
            LOG_ERROR("%s", err);
            rc = 1;
            goto done;
        }
        LOG_INFO("metrics: http://%s:%u/metrics", metrics_address, kb_metrics_server_port(metrics));
    }
    char memory_note[64] = "";
    if (max_memory)
        snprintf(memory_note, sizeof memory_note, ", max memory %llu MiB", (unsigned long long)(max_memory >> 20));
    LOG_INFO("kb-server: data %s, durability %s%s, shard %u/%u%s", data_dir, durability,
             limits.read_only ? ", read-only" : "", limits.shard_index, limits.shard_count ? limits.shard_count : 1,
             memory_note);
    if (endpoint_file && s_write_file(endpoint_file, kb_server_endpoint(server)) != 0) {
        LOG_ERROR("cannot write %s: %s", endpoint_file, strerror(errno));
        rc = 1;
        goto done;
    }
    kb_server_run(server, &s_stop);
done:
    kb_metrics_server_stop(&metrics);
    kb_server_destroy(&server);
    kb_service_destroy(&service);
    kb_bank_close(&bank);
    LOG_INFO("kb-server stopped");
    return rc;
}
